"""A fast drafter training config over a mined dataset, for the training tests."""

from __future__ import annotations

from specagent.config import DrafterTrainConfig, load_config

FAST = ["lora.r=4", "lora.target_modules=[q_proj, v_proj]", "train.threads=1", "train.warmup_steps=0",
        "train.learning_rate=0.01", "train.extra={eval_strategy: 'no'}"]


def drafter_cfg(mined, tmp_path, *overrides) -> DrafterTrainConfig:
    return load_config(DrafterTrainConfig, None, [f"dataset={mined / 'drafter'}", f"output_dir={tmp_path / 'out'}",
                                                  *FAST, *overrides])
