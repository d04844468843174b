"""Offline acceptance during training: the mining metric, measured with the model being trained."""

from __future__ import annotations

import json

import pytest

from specagent.config import AcceptanceSettings, DrafterTrainConfig, load_config
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy
from specagent.train.acceptance import held_out, offline_acceptance
from tests.helpers.mining import noisy_expert


def test_offline_acceptance_is_the_mining_figure(mined):
    """Same drafter, same held-out cut points, same labeler: the figure mining reported."""
    data = held_out(AcceptanceSettings(mined=str(mined), limit=None, max_cuts_per_trajectory=None))
    mined_figures = json.loads((mined / "stats.json").read_text())["validation"]
    kept: list[dict] = []
    noisy = offline_acceptance(ScriptedEngine(noisy_expert(StoreEnv())), data, keep=kept)
    assert len(kept) == noisy["segments"]  # the kept records are the segments counted, labels and all
    assert sum(sum(seg["labels"]) for seg in kept) == noisy["accepted_steps"]
    for key in ("segments", "drafted_steps", "accepted_steps", "acceptance_rate"):
        assert noisy[key] == mined_figures[key]
    assert 0 < noisy["acceptance_rate"] < 1
    runs = noisy["per_run"].values()  # the per-run counts sum to the totals; the interval holds the rate
    assert sum(r["drafted"] for r in runs) == noisy["drafted_steps"]
    assert sum(r["accepted"] for r in runs) == noisy["accepted_steps"]
    lo, hi = noisy["acceptance_ci95"]
    assert lo <= noisy["acceptance_rate"] <= hi
    assert sum(v["drafted"] for v in noisy["by_position"].values()) == noisy["drafted_steps"]
    assert offline_acceptance(ScriptedEngine(expert_policy(StoreEnv())), data)["acceptance_rate"] == 1.0


def test_callback_reports_acceptance_at_start_every_n_steps_and_end(mined, tokenizer, tiny_causal_lm, tmp_path):
    from specagent.train.drafter import train_drafter

    cfg = load_config(DrafterTrainConfig, None, [
        f"dataset={mined / 'drafter'}", f"output_dir={tmp_path / 'out'}", "lora.r=4", "lora.target_modules=[q_proj]",
        "train.threads=1", "train.max_steps=2", "train.save_steps=5", "train.extra={eval_strategy: 'no'}",
        f"acceptance.mined={mined}", "acceptance.every_steps=1", "acceptance.limit=1",
        "acceptance.max_cuts_per_trajectory=2", "acceptance.max_tokens=8",
    ])
    metrics = train_drafter(cfg, tiny_causal_lm, tokenizer)
    records = [json.loads(line) for line in (tmp_path / "out" / "acceptance.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["segments"] == 2 and r["drafted_steps"] >= 2 for r in records)
    assert all(r["acceptance_rate"] == r["accepted_steps"] / r["drafted_steps"] for r in records)
    assert [r["step"] for r in metrics["acceptance"]] == [0, 1, 2]  # logged with the losses too
    logged = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert sum("acceptance_rate" in r for r in logged) == 3
    assert [r["step"] for r in logged if "loss" in r] == [1, 2]  # measuring does not swallow the loss records
    assert not any("acceptance_rate" in r and "entropy" in r for r in logged)  # nor merge into TRL's metrics


def test_acceptance_needs_a_finished_mine_dir(tmp_path):
    from specagent.core.errors import ConfigError

    with pytest.raises(ConfigError, match="not a finished `specagent mine` output dir"):
        held_out(AcceptanceSettings(mined=str(tmp_path)))
