"""The drafter recipe: train = serve formatting, weights move, resume continues the step count."""

from __future__ import annotations

import json

import pytest

from specagent.config import DrafterTrainConfig, load_config
from specagent.core.errors import ConfigError
from specagent.core.types import Message, ToolSpec
from specagent.engines.render import render_prompt
from tests.helpers.training import drafter_cfg

pytest.importorskip("trl")


def test_trainer_tokenizes_exactly_as_the_runtime_renders(mined, tokenizer, tiny_causal_lm, tmp_path):
    from datasets import load_from_disk

    from specagent.train.drafter import drafter_trainer

    trainer = drafter_trainer(drafter_cfg(mined, tmp_path, "max_length=8192"), tiny_causal_lm, tokenizer)
    raw = load_from_disk(str(mined / "drafter"))["train"][0]
    messages = [Message.from_openai(m) for m in raw["messages"]]
    tools = [ToolSpec.from_openai(t) for t in raw["tools"]]
    row = trainer.train_dataset[0]
    runtime = tokenizer(render_prompt(tokenizer, messages, tools, add_generation_prompt=False),
                        add_special_tokens=False)["input_ids"]
    assert row["input_ids"] == runtime
    # the runtime's prompt at every cut point is a prefix of the training sequence
    for cut in [i for i, m in enumerate(messages) if m.role == "assistant"]:
        prompt = tokenizer(render_prompt(tokenizer, messages[:cut], tools), add_special_tokens=False)["input_ids"]
        assert row["input_ids"][: len(prompt)] == prompt
    # loss only on the strong model's assistant turns (and their closing token)
    targets = tokenizer.decode([t for t in row["labels"] if t != -100])
    assert "<tool_call>" in targets and "<|im_end|>" in targets
    assert "You can call these tools" not in targets and "<tool_response>" not in targets
    assert not any(m.content and m.content in targets for m in messages if m.role in ("user", "system"))


def test_training_moves_the_adapter_and_resume_continues_the_step_count(mined, tokenizer, tiny_causal_lm, tmp_path):
    import copy

    import torch
    from safetensors.torch import load_file

    from specagent.train.drafter import train_drafter

    base = copy.deepcopy(tiny_causal_lm)  # the trainer injects LoRA in place; the resumed run needs the same base

    cfg = drafter_cfg(mined, tmp_path, "train.max_steps=2", "train.save_steps=1", "max_length=2048",
                      "train.lr_scheduler=constant")  # resuming with more steps: a decayed schedule would end at 0
    first = train_drafter(cfg, tiny_causal_lm, tokenizer)
    out = tmp_path / "out"
    assert first["global_step"] == 2 and first["peak_rss_gib"] > 0  # what the recipe needed, in metrics.json
    weights = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    lora_b = [w for k, w in weights.items() if "lora_B" in k]
    assert lora_b and all(torch.count_nonzero(w) > 0 for w in lora_b)  # peft starts B at zero
    assert {p.name for p in out.iterdir()} >= {"checkpoint-1", "checkpoint-2", "adapter", "config.yaml",
                                               "versions.json", "log.jsonl", "metrics.json"}
    assert load_config(DrafterTrainConfig, out / "config.yaml") == cfg
    for card in (out / "README.md", out / "adapter" / "README.md"):  # ours, naming the base model; not TRL's
        assert f"base model `{cfg.model}`" in card.read_text() and "None" not in card.read_text()

    again = load_config(DrafterTrainConfig, out / "config.yaml", ["train.max_steps=3"])
    second = train_drafter(again, base, tokenizer)
    assert second["global_step"] == 3
    losses = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in losses if "loss" in r]
    assert steps == [1, 2, 3]  # the resumed run logged step 3 only: it continued from checkpoint-2
    resumed = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert any(not torch.equal(resumed[k], weights[k]) for k in weights)


def test_reward_filter_and_clear_errors(mined, tmp_path):
    from specagent.train.drafter import drafter_data

    train, validation = drafter_data(drafter_cfg(mined, tmp_path, "min_reward=1.0"))
    assert len(train) == 4 and len(validation) == 2 and train.column_names == ["messages", "tools"]
    with pytest.raises(ConfigError, match="no training rows"):
        drafter_data(drafter_cfg(mined, tmp_path, "min_reward=1.5"))
    with pytest.raises(ConfigError, match="run `specagent mine` first"):
        drafter_data(drafter_cfg(mined, tmp_path, f"dataset={tmp_path / 'nowhere'}"))


def test_cli_train_validates_and_dumps_the_config(capsys):
    from specagent.cli import main

    assert main(["train", "drafter", "dataset=d", "train.max_steps=5", "--dump-config"]) == 0
    assert "max_steps: 5" in capsys.readouterr().out
    assert main(["train", "verdict", "dataset=d", "kind=prm", "train.batch_sise=2"]) == 2
    err = capsys.readouterr().err
    assert "kind" in err and "train.batch_sise: unknown key" in err


def test_rows_cut_by_max_length_are_reported(mined, tokenizer, tiny_causal_lm, tmp_path, capsys):
    from specagent.train.drafter import drafter_trainer

    trainer = drafter_trainer(drafter_cfg(mined, tmp_path, "max_length=1500"), tiny_causal_lm, tokenizer)
    assert max(len(ids) for ids in trainer.train_dataset["input_ids"]) == 1500
    printed = capsys.readouterr().out
    assert "max_length=1500 cuts" in printed and "target tokens" in printed
    report = trainer.truncation
    assert report["rows_cut"] > 0 and 0 < report["target_tokens_cut"] < report["target_tokens"]
    trained = sum(sum(t != -100 for t in labels) for labels in trainer.train_dataset["labels"])
    assert trained == report["target_tokens"] - report["target_tokens_cut"]
    uncut = drafter_trainer(drafter_cfg(mined, tmp_path / "uncut", "max_length=8192"), tiny_causal_lm, tokenizer)
    assert uncut.truncation["rows_cut"] == 0 and "target_tokens" not in uncut.truncation
    assert report["target_tokens"] == sum(sum(t != -100 for t in labels) for labels in uncut.train_dataset["labels"])
    with pytest.raises(ConfigError, match="raise max_length"):
        drafter_trainer(drafter_cfg(mined, tmp_path, "max_length=600"), tiny_causal_lm, tokenizer)


def test_target_token_loss_equals_cross_entropy_over_every_assistant_token(mined, tokenizer, tiny_causal_lm, tmp_path):
    """The trainer projects only the target positions through the LM head; the loss must be the
    token-mean cross-entropy that full logits give, and its gradient the same."""
    import torch

    from specagent.train.drafter import drafter_trainer

    trainer = drafter_trainer(drafter_cfg(mined, tmp_path, "max_length=8192", "lora.dropout=0.0"), tiny_causal_lm,
                              tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    model = trainer.model
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                                                 ignore_index=-100)
    expected.backward()
    assert (labels != -100).sum() > 20 and (labels == -100).sum() > 20  # a real mix of target and context
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    for name, grad in ours.items():
        assert torch.allclose(grad, dict(model.named_parameters())[name].grad, atol=1e-6, rtol=1e-3), name
    accuracy = trainer._metrics["train"]["mean_token_accuracy"][-1]
    top1 = (logits.argmax(-1) == labels)[labels != -100].float().mean().item()
    assert accuracy == pytest.approx(top1)
