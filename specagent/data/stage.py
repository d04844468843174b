"""Config glue for the data stage: `collect` and `mine` from their YAML configs."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from specagent.config import CollectConfig, MineConfig, check_resume, dump_config
from specagent.core.classify import classify_tools
from specagent.core.errors import ConfigError
from specagent.core.files import check_output_dir, check_output_file
from specagent.core.types import Message, Trajectory, union_tools
from specagent.data.datasets import finalize, task_split
from specagent.data.mine import Shard, mine_group, mine_shard, mine_shard_on_ray
from specagent.engines import EnginePool
from specagent.engines.batching import batching_engines
from specagent.records.trajectories import read_trajectories, write_trajectories
from specagent.runtime.assembly import (
    DRAFTER_ADAPTER,
    build_env,
    check_resumable,
    protocol_config,
    resolve_adapter,
    scripted_policy,
    select_tasks,
)
from specagent.runtime.drafting import DraftStats, draft_settings, drafting_environment
from specagent.runtime.provenance import versions
from specagent.runtime.ray_pool import check_executor


def mine_from_config(cfg: MineConfig, shard: Shard = Shard(), merge: int | None = None,
                     worker: type | None = None) -> dict[str, Any] | None:
    """Mine one shard (and, unsharded, build the datasets); or with ``merge=N`` only build
    the datasets from N finished shard files. ``worker``: the class that mines (`MineWorker`;
    tests give one whose drafter is noisy, or dies)."""
    trajectories = mined_trajectories(cfg)
    _check_mine(cfg, trajectories)  # everything checked before anything is written
    check_executor(cfg.executor)
    task_split(trajectories, cfg.validation_tasks, cfg.validation_fraction, cfg.split_by)  # unknown ids fail here
    out_dir = check_output_dir(cfg.output_dir, "output_dir")
    work_dir = out_dir / "shards"
    if any(work_dir.glob("shard-*.jsonl")):  # mined work to resume: it must be this config's
        check_resume(out_dir / "mine_config.yaml", cfg, "mine with the saved config, or into another output_dir "
                     f"(or delete {work_dir} to start over)")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mine_config.yaml").write_text(dump_config(cfg))
    if merge is None:
        _mine(cfg, trajectories, work_dir, shard, worker or MineWorker)
        if shard.count > 1:
            print(f"shard {shard.index}/{shard.count} done; when all are, run with --merge {shard.count}")
            return None
    count = merge or 1
    stats = finalize(trajectories, work_dir, out_dir, count, cfg.validation_tasks, cfg.validation_fraction,
                     cfg.model_dump(mode="json"), versions(), cfg.split_by)
    print(f"datasets: {out_dir}/segments, {out_dir}/drafter, {out_dir}/verdict   card: {out_dir}/README.md")
    a = stats["all"]
    print(f"segments {a['segments']}  drafted steps {a['drafted_steps']}  accepted {a['accepted_steps']}  "
          f"acceptance {a['acceptance_rate'] or 0:.3f}  ended_by {a['ended_by']}")
    return stats


def mined_trajectories(cfg: MineConfig) -> list[Trajectory]:
    """The trajectories a mine reads: those of `tasks` (all if None), then every `stride`-th, then
    the first `limit`; with `min_reward`, only the runs that scored it (or have no reward) before
    `stride` and `limit`. A task id that names no trajectory is an error (a typo would mine nothing)."""
    trajectories = read_trajectories(cfg.trajectories)
    if cfg.tasks is not None:
        wanted = set(cfg.tasks)
        missing = sorted(wanted - {t.task_id for t in trajectories})
        if missing:
            raise ConfigError(f"tasks: {missing} name no trajectory of {cfg.trajectories}")
        trajectories = [t for t in trajectories if t.task_id in wanted]
    if cfg.min_reward is not None:
        kept = [t for t in trajectories if t.reward is None or t.reward >= cfg.min_reward]
        before, after = {t.task_id for t in trajectories}, {t.task_id for t in kept}
        lost = sorted({str(v) for v in cfg.validation_tasks or ()} & before - after)
        if lost:
            raise ConfigError(f"validation_tasks: {len(lost)} id(s) have no run with reward >= min_reward "
                              f"{cfg.min_reward}: {', '.join(lost[:5])} (lower min_reward or drop them)")
        print(f"min_reward {cfg.min_reward}: {len(kept)} of {len(trajectories)} runs kept")
        trajectories = kept
    return trajectories[:: cfg.stride][: cfg.limit]


def _check_mine(cfg: MineConfig, trajectories: list[Trajectory]) -> tuple[Any, str | None, Any]:
    """(drafter engine config, its adapter name, the live environment or None), every check
    made that needs no model: the adapter, the tool lists, the live environment."""
    drafter, adapter = resolve_adapter(cfg.drafter, cfg.drafter_adapter, DRAFTER_ADAPTER)
    classify_tools(union_tools(trajectories), cfg.env.read_only, cfg.env.write)  # a misspelt tool name fails here
    env = None if cfg.env.name == "replay" else build_env(cfg.env)
    if env is not None:
        roles = [drafter] + ([cfg.strong] if cfg.strong else [])
        scripted_policy(env, roles)
    return drafter, adapter, env


class MineWorker:
    """What mines groups of trajectories, built from a mine config where it runs (this
    process, or a Ray actor): the drafter (and strong) engines, how drafted lookups are
    answered, the DRAFT and labeling settings. ``trajectories``: all of the run's (a replay
    environment answers from every recorded run of a task), looked up by id."""

    def __init__(self, cfg: MineConfig, trajectories: list[Trajectory]) -> None:
        drafter, adapter, live_env = _check_mine(cfg, trajectories)
        self.settings = draft_settings(cfg, drafter_adapter=adapter)
        self.jobs_for, self.restore_for = drafting_environment(cfg, trajectories, self.settings)
        self._by_id = {t.id: t for t in trajectories}
        self._pool = EnginePool()
        roles = {"drafter": drafter} | ({"strong": cfg.strong} if cfg.strong else {})
        policy = None if live_env is None else scripted_policy(live_env, roles.values())
        engines = self._pool.for_roles(roles, policy)
        self.drafter, self.strong = engines["drafter"], engines.get("strong")

    def mine(self, trajectory_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The shard rows of these trajectories (one group, drafted in one batch), as JSON objects."""
        group = [self._by_id[i] for i in trajectory_ids]
        rows = mine_group(group, self.drafter, self.jobs_for, self.settings, DraftStats(), self.strong, self.restore_for)
        return [row.dump() for row in rows]

    def close(self) -> None:
        self._pool.close()


def _mine(cfg: MineConfig, trajectories: list[Trajectory], work_dir: Path, shard: Shard, worker: type) -> None:
    """This shard's trajectories: here with ``worker``'s engines, or by Ray actors each running one."""
    if cfg.executor.kind == "ray":
        mine_shard_on_ray(trajectories, worker, cfg, work_dir, shard)
        return
    here = worker(cfg, trajectories)
    try:
        mine_shard(trajectories, here.drafter, here.jobs_for, here.settings, work_dir, shard, here.strong,
                   here.restore_for)
    finally:
        here.close()


def collect_from_config(cfg: CollectConfig, worker: type | None = None) -> Path:
    """Strong-model runs on an environment, appended to a trajectories.jsonl (resumable), in
    this process or on Ray actors (`executor`; ``worker``: the class each actor runs, tests)."""
    env = build_env(cfg.env)
    tasks = select_tasks(env, cfg.env)  # everything checked before anything is written
    read_only = classify_tools(env.tool_specs(), cfg.env.read_only, cfg.env.write)  # a misspelt name fails here
    scripted_policy(env, [cfg.strong])
    check_executor(cfg.executor)
    out = check_output_file(cfg.output, "output")
    episodes, saved = collect_files(out)
    check_output_file(episodes, "episodes file")
    check_resumable(episodes, saved, cfg, f"collect with the saved config, or delete {episodes} to start over, "
                                          "or choose another output")
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(dump_config(cfg))
    if cfg.executor.kind == "ray":
        records = _collect_on_ray(cfg, tasks, episodes, worker)
    else:
        records = _collect_here(cfg, env, tasks, episodes)
    records = in_run_order(records, tasks, cfg.trials)
    tools = [replace(spec, read_only=read_only[spec.name]) for spec in env.tool_specs()]
    # the user mode is part of the id: the same task played by another user is another run
    name = env.name if cfg.env.user == "ticket" else f"{env.name}-{cfg.env.user}"
    trajectories = [
        Trajectory(
            id=f"{name}:{r['task_id']}:{r['trial']}", task_id=str(r["task_id"]), tools=tools,
            messages=[Message.from_openai(m) for m in r["messages"]], reward=r["reward"],
            source=f"collect:{env.name}", model=r["models"].get("strong", ""),
            meta={"stop_reason": r["stop_reason"], "user": cfg.env.user},
        )
        for r in records if cfg.min_reward is None or r["reward"] >= cfg.min_reward
    ]
    if cfg.made_up_users:
        from specagent.envs.store.made_up import rename

        rng = random.Random(0)
        trajectories = [t for t in (rename(t, rng) for t in trajectories) if t is not None]
    write_trajectories(out, trajectories)
    print(f"{len(trajectories)} trajectories -> {out} (mean reward "
          f"{sum(t.reward or 0 for t in trajectories) / max(len(trajectories), 1):.2f})")
    return out


def _collect_here(cfg: CollectConfig, env: Any, tasks: list[str], episodes: Path) -> list[dict[str, Any]]:
    from specagent.core.protocol import Models
    from specagent.runtime.episodes import run_tasks

    pool = EnginePool()
    try:
        engines = pool.for_roles({"strong": cfg.strong}, scripted_policy(env, [cfg.strong]))
        strong = (batching_engines(engines) if cfg.concurrency > 1 else engines)["strong"]
        return run_tasks(env, tasks, ["strong"], Models(strong=strong), protocol_config(cfg.protocol, cfg.env),
                         episodes, trials=cfg.trials, model_names={"strong": strong.model_name},
                         concurrency=cfg.concurrency, env_factory=lambda: build_env(cfg.env),
                         rerun_hazard=cfg.env.rerun_hazard())
    finally:
        pool.close()


def _collect_on_ray(cfg: CollectConfig, tasks: list[str], episodes: Path, worker: type | None) -> list[dict[str, Any]]:
    from specagent.config import RuntimeSpec
    from specagent.runtime.episodes import episode_jobs
    from specagent.runtime.ray_episodes import EpisodePlan, run_jobs_on_ray

    spec = RuntimeSpec(env=cfg.env, strong=cfg.strong, protocol=cfg.protocol)
    plan = EpisodePlan(env=cfg.env, engines={"strong": cfg.strong}, arms={"strong": (spec, "strong")},
                       protocol=protocol_config(cfg.protocol, cfg.env), concurrency=cfg.concurrency)
    jobs = episode_jobs(tasks, ["strong"], cfg.trials)
    return run_jobs_on_ray(plan, jobs, episodes, cfg.executor, **({"worker": worker} if worker else {}))


def in_run_order(records: list[dict[str, Any]], tasks: list[str], trials: int) -> list[dict[str, Any]]:
    """Records in the order one process at concurrency 1 runs them (trial, then task), so
    the trajectories file (whose order `stride` and `limit` of a mine read) does not depend
    on which episode finished first; records of other tasks keep their place at the end."""
    from specagent.runtime.episodes import episode_jobs, episode_key

    order = {job.key: n for n, job in enumerate(episode_jobs(tasks, ["strong"], trials))}
    return sorted(records, key=lambda r: order.get(episode_key(r), len(order)))


def collect_files(out: Path) -> tuple[Path, Path]:
    """The episodes file a collect into ``out`` resumes from, and the config it saves beside it."""
    return out.with_name(out.stem + ".episodes.jsonl"), out.with_name(out.stem + ".config.yaml")


