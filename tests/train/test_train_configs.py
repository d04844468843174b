"""Every shipped train and accelerate config validates (see also tests/test_configs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specagent.config import DrafterTrainConfig, VerdictTrainConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
DRAFTER = sorted((ROOT / "configs" / "train" / "drafter").glob("*.yaml"))
VERDICT = sorted((ROOT / "configs" / "train" / "verdict").glob("*.yaml"))
ACCELERATE = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))


@pytest.mark.parametrize("path", DRAFTER, ids=lambda p: p.name)
def test_shipped_drafter_config_validates(path):
    dataset = load_config(DrafterTrainConfig, path).dataset
    files = dataset if isinstance(dataset, list) else [dataset]
    # a mined `drafter` dataset, or trajectories files (collect / import)
    assert all(f.endswith("drafter") or f.endswith(".jsonl") for f in files)


@pytest.mark.parametrize("path", VERDICT, ids=lambda p: p.name)
def test_shipped_verdict_config_validates(path):
    assert load_config(VerdictTrainConfig, path).dataset.endswith("verdict")


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_shipped_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(path))
    assert cfg.num_processes >= 1
    raw = yaml.safe_load(path.read_text())
    ds_file = raw.get("deepspeed_config", {}).get("deepspeed_config_file")
    if ds_file:  # relative to the repository root, where `accelerate launch` runs
        stage = json.loads((ROOT / ds_file).read_text())["zero_optimization"]["stage"]
        assert f"zero{stage}" in path.stem


def test_there_are_configs():
    assert DRAFTER and VERDICT and len(ACCELERATE) == 5
