"""Model backends behind the one `ChatEngine` interface of `specagent.core.interfaces`.

Backends import their heavy stacks lazily, so `specagent --help` and the core work
without torch or vLLM installed.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from specagent.core.interfaces import ChatEngine


def build_engine(cfg: Any, scripted_policy: Callable | None = None) -> ChatEngine:
    """One engine from an `EngineConfig`."""
    match cfg.backend:
        case "transformers":
            from specagent.engines.transformers_engine import TransformersEngine

            return TransformersEngine(
                model=cfg.model, gguf_file=cfg.gguf_file, adapters=dict(cfg.adapters), dtype=cfg.dtype,
                temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                max_model_len=cfg.max_model_len, batch_size=cfg.batch_size, threads=cfg.threads,
            )
        case "vllm":
            from specagent.engines.vllm_engine import VLLMEngine

            return VLLMEngine(
                model=cfg.model, gguf_file=cfg.gguf_file, adapters=dict(cfg.adapters),
                temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                max_model_len=cfg.max_model_len, engine_kwargs=dict(cfg.engine_kwargs), head_scoring=cfg.head_scoring,
                logprobs_read_cache=cfg.logprobs_read_cache,
            )
        case "openai":
            from specagent.engines.openai_engine import OpenAIEngine

            return OpenAIEngine(
                base_url=cfg.base_url, model=cfg.model, api_key=os.environ.get(cfg.api_key_env),
                timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, temperature=cfg.temperature,
                seed=cfg.seed, tokenizer=cfg.tokenizer, adapters=dict(cfg.adapters),
            )
        case "scripted":
            from specagent.engines.scripted import ScriptedEngine

            if scripted_policy is None:
                raise ValueError("the scripted backend needs a policy")
            return ScriptedEngine(scripted_policy, model_name=f"scripted-{cfg.script}")
    raise ValueError(f"unknown backend {cfg.backend!r}")


class EnginePool:
    """Builds each distinct engine once: roles with the same backend/model/options share it
    (one vLLM engine can serve the base model and several LoRA adapters)."""

    def __init__(self) -> None:
        self._engines: dict[tuple, ChatEngine] = {}

    def for_roles(self, roles: dict[str, Any], scripted_policy: Callable | None = None) -> dict[str, ChatEngine]:
        """Engines for named roles; configs that share an engine pool their adapters."""
        merged: dict[tuple, Any] = {}
        for cfg in roles.values():
            key = cfg.share_key()
            if key in merged:
                adapters = {**merged[key].adapters, **cfg.adapters}
                merged[key] = merged[key].model_copy(update={"adapters": adapters})
            else:
                merged[key] = cfg
        for key, cfg in merged.items():
            if key not in self._engines:
                self._engines[key] = build_engine(cfg, scripted_policy)
        return {role: self._engines[cfg.share_key()] for role, cfg in roles.items()}

    def reset_prefix_caches(self) -> None:
        """Empty every engine's prefix cache (engines that keep one: vLLM), so what runs next
        finds none of what ran before: an eval's arms are measured from the same cold start."""
        for engine in self._engines.values():
            reset = getattr(engine, "reset_prefix_cache", None)
            if reset is not None:
                reset()

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
