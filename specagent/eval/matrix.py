"""`specagent eval`: a matrix of arms on one environment's tasks, into one `episodes.jsonl`.

Every distinct engine is built once for the whole matrix, with the adapters of every arm
registered on it, so arms differ only by the adapter names and verifier they use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specagent.config import EvalConfig
from specagent.engines import EnginePool
from specagent.eval.arms import ArmRun, arm_engines, arm_spec, expand_arms, with_shared_adapters
from specagent.eval.report import write_report
from specagent.runtime.assembly import (
    build_env,
    build_models,
    check_models,
    open_run,
    protocol_config,
    scripted_policy,
)
from specagent.runtime.episodes import episode_jobs, run_tasks
from specagent.runtime.ray_pool import check_executor


def eval_from_config(cfg: EvalConfig, worker: type | None = None) -> dict[str, Any]:
    """Run every arm's missing episodes (in this process, or on Ray actors: `executor`), then
    write the report. Returns the report. ``worker``: the class each Ray actor runs (tests)."""
    shared = with_shared_adapters(cfg)  # every arm's adapter settled: a missing one fails before any output
    runs = expand_arms(shared.arms)

    def check(env, tasks) -> None:
        for run in runs:
            check_models(arm_spec(shared, run), env, (run.arm.mode,), tasks)

    check_executor(cfg.executor)
    env, tasks, out_dir, episodes = open_run(cfg, check)
    roles = arm_engines(shared, runs)
    if cfg.executor.kind == "ray":
        _run_on_ray(shared, runs, roles, tasks, episodes, worker)
    else:
        _run_here(shared, runs, roles, env, tasks, episodes)
    return write_report(out_dir)


def _run_here(cfg: EvalConfig, runs: list[ArmRun], roles: dict[str, Any], env: Any, tasks: list[str],
              episodes: Path) -> None:
    """Arm after arm in this process, ``cfg.concurrency`` episodes side by side."""
    pool = EnginePool()
    try:
        pool.for_roles(roles, scripted_policy(env, roles.values()))  # every engine once, every adapter on it
        for run in runs:
            pool.reset_prefix_caches()  # no arm reuses the prefill of an arm before it
            spec = arm_spec(cfg, run)
            models = build_models(spec, env, pool, (run.arm.mode,), batch=cfg.concurrency > 1)
            names = {r: getattr(models, r).model_name for r in ("strong", "weak") if getattr(models, r) is not None}
            run_tasks(env, tasks, [run.arm.mode], models, protocol_config(spec.protocol, cfg.env), episodes,
                      trials=cfg.trials, model_names=names, arm=run.label, concurrency=cfg.concurrency,
                      env_factory=lambda: build_env(cfg.env), rerun_hazard=cfg.env.rerun_hazard())
    finally:
        pool.close()


def _run_on_ray(cfg: EvalConfig, runs: list[ArmRun], roles: dict[str, Any], tasks: list[str], episodes: Path,
                worker: type | None) -> None:
    """Every arm's episodes at once on the Ray actors; each actor builds every engine once."""
    from specagent.runtime.ray_episodes import EpisodePlan, run_jobs_on_ray

    plan = EpisodePlan(env=cfg.env, engines=roles, protocol=protocol_config(cfg.protocol, cfg.env),
                       arms={run.label: (arm_spec(cfg, run), run.arm.mode) for run in runs},
                       concurrency=cfg.concurrency)
    jobs = [job for run in runs for job in episode_jobs(tasks, [run.arm.mode], cfg.trials, run.label)]
    run_jobs_on_ray(plan, jobs, episodes, cfg.executor, **({"worker": worker} if worker else {}))
