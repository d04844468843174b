"""The DeepSpeed ZeRO-2 path runs here on CPU: `accelerate launch` with the shipped CPU
config, one process, gloo, one optimizer step on a tiny model. Skipped without deepspeed
(`pip install deepspeed`; the first run builds a small CPU op, about a minute)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed is not installed (pip install deepspeed, or the `deepspeed` extra)")
def test_deepspeed_zero2_runs_one_step_on_cpu(mined, tokenizer, tmp_path):
    import torch
    from transformers import LlamaForCausalLM

    from tests.train.conftest import tiny_llama_config

    torch.manual_seed(0)
    LlamaForCausalLM(tiny_llama_config(tokenizer)).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--config_file", "configs/accelerate/cpu_deepspeed_zero2.yaml",
               "-m", "specagent", "train", "drafter", f"dataset={mined / 'drafter'}", f"model={tmp_path / 'tiny'}",
               f"output_dir={out}", "train.max_steps=1", "train.threads=1", "lora.r=4",
               "train.extra={ddp_backend: gloo, eval_strategy: 'no'}"]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # a DeepSpeed checkpoint with ZeRO-sharded optimizer state, and the final adapter
    assert (out / "checkpoint-1" / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").exists()
    assert json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["global_step"] == 1
    assert (out / "adapter" / "adapter_model.safetensors").exists()
    assert "deepspeed" in json.loads((out / "versions.json").read_text())
