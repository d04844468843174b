"""A head that also keeps acting (act_loss_weight): the causal-LM loss on the strong model's own
turns in each verify prompt's context is added to the boundary loss, so the head can be
merged into the strong model and one set of weights acts and judges."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")


def test_act_labels_mark_the_context_turns_of_the_strong_model(mined, tokenizer):
    from datasets import load_from_disk

    from specagent.records.segments import VerdictRow
    from specagent.train.verdict import IGNORE, token_labels

    rows = load_from_disk(str(mined / "verdict"))["train"]
    row = next(r for r in rows if any(m["role"] == "assistant" for m in r["messages"][: r["step_message_indices"][0]]))
    out = token_labels(tokenizer, row)
    acts = [i for i, t in enumerate(out["act_labels"]) if t != IGNORE]
    assert acts and max(acts) < min(i for i, t in enumerate(out["labels"]) if t != IGNORE)  # before the drafts
    text = tokenizer.decode([out["input_ids"][i] for i in acts])
    first_turn = VerdictRow.parse(row, "row").chat()[: row["step_message_indices"][0]]
    said = [m for m in first_turn if m.role == "assistant"]
    assert "<tool_call>" in text or any((m.content or "")[:10] in text for m in said)
    assert "<|im_start|>user" not in text and "<tool_response>" not in text


def test_the_act_loss_adds_to_the_boundary_loss(mined, tokenizer, tiny_causal_lm,
                                                                                   tmp_path):
    import copy

    import torch

    from specagent.config import VerdictTrainConfig, load_config
    from specagent.train.verdict import boundary_logprobs, boundary_loss, head_trainer

    def cfg(weight: float) -> VerdictTrainConfig:
        return load_config(VerdictTrainConfig, None, [
            f"dataset={mined / 'verdict'}", f"output_dir={tmp_path / str(weight)}", f"act_loss_weight={weight}",
            "lora.r=4", "lora.target_modules=[q_proj, v_proj]", "train.max_steps=1", "train.threads=1",
            "train.learning_rate=0.01", "train.warmup_steps=0", "train.extra={eval_strategy: 'no'}"])

    trainer, _ = head_trainer(cfg(1.0), copy.deepcopy(tiny_causal_lm), tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    assert (batch["act_labels"] != -100).any()
    with torch.no_grad():
        picked, labels, lm = boundary_logprobs(trainer.model, batch, trainer.candidates, with_act=True)
        combined = trainer.compute_loss(trainer.model, batch)
        assert combined.item() == pytest.approx((boundary_loss(picked, labels) + lm).item(), rel=1e-5)
        assert lm.item() > 0
    only_head, _ = head_trainer(cfg(0.0), copy.deepcopy(tiny_causal_lm), tokenizer)
    with torch.no_grad():
        assert only_head.compute_loss(only_head.model, batch).item() == pytest.approx(
            boundary_loss(picked, labels).item(), rel=1e-4)
