"""The verdict recipes: boundary labels through the collator, the head's loss and training,
the generative adapter's targets, and the validation figures."""

from __future__ import annotations

import json
import math

import pytest

from specagent.config import VerdictTrainConfig, load_config
from specagent.train.verdict_metrics import accepted_prefix, auroc, calibrate, head_metrics, prefix_metrics

FAST = ["lora.r=4", "lora.target_modules=[q_proj, v_proj]", "train.threads=1", "train.warmup_steps=0",
        "train.learning_rate=0.01", "train.lr_scheduler=constant"]


def verdict_cfg(mined, tmp_path, *overrides) -> VerdictTrainConfig:
    return load_config(VerdictTrainConfig, None, [f"dataset={mined / 'verdict'}", f"output_dir={tmp_path / 'out'}",
                                                  *FAST, *overrides])


@pytest.fixture(scope="module")
def verdict_rows(mined):
    from datasets import load_from_disk

    return load_from_disk(str(mined / "verdict"))


def test_collator_pads_and_keeps_boundary_labels_on_a_decoded_example(verdict_rows, tokenizer):
    import torch

    from specagent.train.verdict import BoundaryCollator, boundary_example

    rows = sorted(verdict_rows["train"], key=lambda r: len(r["labels"]))
    long_row, short_row = rows[-1], rows[0]
    assert len(long_row["labels"]) >= 2 and 0 in [y for r in rows for y in r["labels"]]
    examples = [boundary_example(tokenizer, r, None) for r in (short_row, long_row)]
    batch = BoundaryCollator(tokenizer.pad_token_id)(examples)
    assert batch["labels"].dtype == torch.long and batch["input_ids"].dtype == torch.long
    for i, (row, example) in enumerate(zip((short_row, long_row), examples)):
        n = len(example["input_ids"])
        labels = batch["labels"][i]
        marked = (labels != -100).nonzero().flatten().tolist()
        assert labels[marked].tolist() == row["labels"]
        assert all(tokenizer.decode(batch["input_ids"][i, p]) == "<|im_end|>" for p in marked)
        assert batch["attention_mask"][i, :n].all() and not batch["attention_mask"][i, n:].any()
        assert (labels[n:] == -100).all() and set(labels.tolist()) <= {-100, 0, 1}
        # the text before each boundary is the drafted step's end, the review request comes last
        text = tokenizer.decode(batch["input_ids"][i, : marked[-1] + 1])
        assert text.endswith("<|im_end|>") and "REVIEW." in tokenizer.decode(batch["input_ids"][i, marked[-1]: n])


def test_collator_refuses_bool_and_non_label_values(tokenizer):
    import torch

    from specagent.train.verdict import BoundaryCollator

    collate = BoundaryCollator(tokenizer.pad_token_id)
    labels = [-100, -100, 1, -100, 0]
    assert torch.tensor(labels).bool().tolist() == [True, True, True, True, False]  # the trap: -100 reads as True
    with pytest.raises(TypeError, match="bool"):
        collate([{"input_ids": [1, 2, 3, 4, 5], "labels": torch.tensor(labels).bool()}])
    with pytest.raises(ValueError, match="-100, 0 or 1"):
        collate([{"input_ids": [1, 2, 3], "labels": [-100, 2, 0]}])
    with pytest.raises(ValueError, match="-100, 0 or 1"):
        collate([{"input_ids": [1, 2], "labels": [0.0, 1.0]}])
    assert collate([{"input_ids": [1, 2, 3], "labels": [-100, True, False]}])["labels"].tolist() == [[-100, 1, 0]]


def test_boundary_logprobs_read_only_boundaries_and_the_loss_is_bce_on_the_margin(tiny_causal_lm, tokenizer):
    import torch

    from specagent.train.verdict import MASS_WEIGHT, boundary_logprobs, boundary_loss

    yes, no = tokenizer("yes", add_special_tokens=False)["input_ids"][0], tokenizer("no", add_special_tokens=False)["input_ids"][0]
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": (ids != 0).long(),
             "labels": torch.tensor([[-100, 1, -100, -100, 0, -100], [-100, -100, 1, -100, -100, -100]])}
    logprobs, labels = boundary_logprobs(tiny_causal_lm, batch, (yes, no))
    full = torch.log_softmax(tiny_causal_lm(input_ids=ids, attention_mask=batch["attention_mask"]).logits, -1)
    expected = torch.stack([full[0, 1, [yes, no]], full[0, 4, [yes, no]], full[1, 2, [yes, no]]])
    assert labels.tolist() == [1, 0, 1]
    assert torch.allclose(logprobs, expected, atol=1e-5)

    pairs = torch.log(torch.tensor([[0.6, 0.2], [0.3, 0.5]]))
    margin = [math.log(3.0), math.log(0.6)]
    bce = (math.log1p(math.exp(-margin[0])) + math.log1p(math.exp(margin[1]))) / 2
    mass = -(math.log(0.8) + math.log(0.8)) / 2
    assert boundary_loss(pairs, torch.tensor([1, 0])).item() == pytest.approx(bce + MASS_WEIGHT * mass, rel=1e-5)


def test_head_trains_scores_every_step_with_zero_decoding_and_resumes(mined, tokenizer, tmp_path):
    import copy

    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from specagent.train.verdict import train_verdict
    from tests.train.conftest import tiny_llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(tokenizer))
    base = copy.deepcopy(model)
    cfg = verdict_cfg(mined, tmp_path, "train.max_steps=2", "train.save_steps=1", "train.batch_size=2")
    metrics = train_verdict(cfg, model, tokenizer)
    out = tmp_path / "out"
    assert metrics["global_step"] == 2
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert any("lora_B" in k and torch.count_nonzero(w) > 0 for k, w in saved.items())
    calibrated = metrics["calibrated"]
    assert calibrated["decoded_tokens_per_verdict"] == 0.0
    assert calibrated["segments"] > 0 and calibrated["steps"] >= calibrated["segments"]
    assert calibrated["false_accept_rate"] is None or calibrated["false_accept_rate"] <= cfg.target_false_accept
    assert 0.0 <= (calibrated["auroc"] if calibrated["auroc"] is not None else 0.5) <= 1.0
    card = json.loads((out / "adapter" / "verdict.json").read_text())
    assert card["kind"] == "head" and card["threshold"] == metrics["threshold"] and card["yes"] == "yes"

    again = load_config(VerdictTrainConfig, out / "config.yaml", ["train.max_steps=3"])
    assert train_verdict(again, copy.deepcopy(base), tokenizer)["global_step"] == 3
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [1, 2, 3]


def test_the_runtime_head_verifier_reads_what_training_scored(mined, tokenizer, tmp_path, verdict_rows):
    """Train/serve parity: the HeadVerifier on the transformers engine gives, for a validation
    segment, the probabilities the training-time scorer computed, and decodes nothing."""
    import copy

    import torch
    from transformers import LlamaForCausalLM

    from specagent.core.types import Message, Segment, ToolSpec
    from specagent.engines.transformers_engine import TransformersEngine
    from specagent.engines.verdict_head import HeadVerifier
    from specagent.records.segments import DraftedStepRecord
    from specagent.train.verdict import BoundaryCollator, boundary_example, score_boundaries, train_verdict
    from tests.train.conftest import tiny_llama_config

    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_llama_config(tokenizer))
    train_verdict(verdict_cfg(mined, tmp_path, "train.max_steps=1"), copy.deepcopy(base), tokenizer)
    engine = TransformersEngine.from_model(base, tokenizer, max_model_len=10**6, threads=1)
    verifier = HeadVerifier(engine, tmp_path / "out", threshold=0.5)

    from datasets import load_from_disk

    segments = {r["id"]: r for r in load_from_disk(str(mined / "segments"))["validation"]}
    row = next(r for r in verdict_rows["validation"] if len(r["labels"]) >= 2)
    segment_row = segments[row["segment_id"]]
    steps = [s for s in (DraftedStepRecord.parse(j, "step").step() for j in segment_row["steps"]) if s.kind.value != "malformed"]
    messages = [Message.from_openai(m) for m in row["messages"]]
    context = messages[: row["step_message_indices"][0]]
    tools = [ToolSpec.from_openai(t) for t in row["tools"]]
    verdict, usages = verifier.verify(context, tools, Segment(len(context), tuple(steps), "held"))

    peft = engine.model
    peft.set_adapter(verifier.adapter)
    example = boundary_example(tokenizer, row, None)
    trained, _ = score_boundaries(peft, [example], BoundaryCollator(tokenizer.pad_token_id), verifier.candidates)
    assert list(verdict.scores) == pytest.approx(trained[0], abs=1e-5)
    assert len(verdict.scores) == len(row["labels"])
    assert [u.completion_tokens for _, u in usages] == [0]
    assert usages[0][1].prompt_tokens == len(example["input_ids"])


def test_generative_adapter_learns_only_the_verdict(mined, tokenizer, tiny_causal_lm, tmp_path, verdict_rows):
    from specagent.train.verdict import evaluate_generative, generative_trainer

    cfg = verdict_cfg(mined, tmp_path, "kind=generative", "train.max_steps=1", "eval_limit=2", "eval_max_tokens=3")
    trainer, validation = generative_trainer(cfg, tiny_causal_lm, tokenizer)
    row, raw = trainer.train_dataset[0], verdict_rows["train"][0]
    targets = tokenizer.decode([t for t in row["labels"] if t != -100])
    assert targets == f"{sum(raw['labels'])}<|im_end|>"
    # the prompt part is the runtime's verify prompt, byte for byte
    from specagent.core.types import Message, ToolSpec
    from specagent.engines.render import render_prompt

    prompt = render_prompt(tokenizer, [Message.from_openai(m) for m in raw["prompt"]],
                           [ToolSpec.from_openai(t) for t in raw["tools"]])
    runtime = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert row["input_ids"][: len(runtime)] == runtime and row["labels"][len(runtime) - 1] == -100
    assert trainer.train().global_step == 1
    figures = evaluate_generative(cfg, trainer, validation)["validation"]
    assert figures["segments"] == 2 and figures["auroc"] is None
    assert 0 < figures["decoded_tokens_per_verdict"] <= 3


def test_verdict_metrics_on_handmade_scores():
    assert accepted_prefix([0.9, 0.4, 0.95], 0.5) == 1
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([0.5, 0.5], [0, 1]) == pytest.approx(0.5) and auroc([0.2], [1]) is None
    labels = [[1, 1, 0], [0, 0], [1]]
    scores = [[0.9, 0.8, 0.7], [0.6, 0.1], [0.95]]
    figures = head_metrics(scores, labels, 0.5)
    # predicted prefixes 3, 1, 1 against 2, 0, 1: two invalid steps accepted out of three
    assert figures["prefix_accuracy"] == pytest.approx(1 / 3)
    assert figures["false_accept_rate"] == pytest.approx(2 / 3) and figures["false_reject_rate"] == 0.0
    threshold = calibrate(scores, labels, 0.0)
    assert threshold == 0.8 and head_metrics(scores, labels, threshold)["false_accept_rate"] == 0.0
    assert head_metrics(scores, labels, threshold)["prefix_accuracy"] == 1.0
    assert prefix_metrics([0, 0, 0], labels)["degenerate"] and not figures["degenerate"]
