"""Episodes on Ray actors: `collect` and `eval` with `executor.kind: ray` (`--ray`).

An `EpisodeWorker` is what one actor holds: its environments and every arm's models,
built inside the actor from the configs of an `EpisodePlan`. It runs one episode per call
with `play_episode`, the function `run_tasks` runs in this process, so the two paths
cannot drift. `run_jobs_on_ray` is the driver: it skips the episodes already in the
episodes file, feeds the others to the actors, and appends each record as it arrives, with
the same resume key as `run_tasks` (see `ray_pool` for what happens when an actor dies).
"""

from __future__ import annotations

import queue
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from specagent.config import EnvConfig, ExecutorConfig, RuntimeSpec
from specagent.core.interfaces import ChatEngine
from specagent.core.protocol import Models, ProtocolConfig
from specagent.engines import EnginePool
from specagent.engines.batching import BatchingEngine, CallerGroup
from specagent.runtime.assembly import build_env, build_models, protocol_config, scripted_policy
from specagent.runtime.episodes import (
    EpisodeJob,
    StartJournal,
    append_record,
    episode_key,
    play_episode,
    resumable_records,
)
from specagent.runtime.progress import progress as progress_bar
from specagent.runtime.ray_pool import ActorPool, Progress, connect, shutdown_if


@dataclass(frozen=True)
class EpisodePlan:
    """What a worker builds: the environment, the engines (every adapter registered, so each
    is built once), each arm's runtime and mode, the protocol, and how many episodes it runs
    side by side (their requests batched in its engines)."""

    env: EnvConfig
    engines: dict[str, Any]  # role -> engine config
    arms: dict[str, tuple[RuntimeSpec, str]]  # arm label (the mode outside an eval) -> (its runtime, its mode)
    protocol: ProtocolConfig
    concurrency: int = 1


class _BatchedPool(EnginePool):
    """Engines behind one BatchingEngine each, shared by every arm in one CallerGroup: the
    episodes an actor runs side by side batch together, whatever their arm, and only the
    batching thread calls an engine."""

    def __init__(self) -> None:
        super().__init__()
        self.group = CallerGroup()
        self._wrapped: dict[int, BatchingEngine] = {}

    def for_roles(self, roles: dict[str, Any], scripted_policy: Any = None) -> dict[str, ChatEngine]:
        engines = super().for_roles(roles, scripted_policy)
        for engine in engines.values():
            self._wrapped.setdefault(id(engine), BatchingEngine(engine, self.group))
        return {role: self._wrapped[id(engine)] for role, engine in engines.items()}


def model_names(models: Models) -> dict[str, str]:
    """Role -> model name, as the episode records carry them."""
    return {r: getattr(models, r).model_name for r in ("strong", "weak") if getattr(models, r) is not None}


class EpisodeWorker:
    """One actor's share of a run: `plan.concurrency` environments and the models of every
    arm, built here (in the actor's process, on its GPU or CPUs)."""

    def __init__(self, plan: EpisodePlan) -> None:
        self.plan = plan
        first = build_env(plan.env)
        self._pool = _BatchedPool() if plan.concurrency > 1 else EnginePool()
        self._pool.for_roles(plan.engines, scripted_policy(first, plan.engines.values()))  # each engine once
        self._models = {arm: build_models(spec, first, self._pool, (mode,)) for arm, (spec, mode) in plan.arms.items()}
        # an eval arm may draft with its own settings (`ArmConfig.drafting`)
        self._protocols = {arm: protocol_config(spec.protocol, plan.env) for arm, (spec, _) in plan.arms.items()}
        self._envs: queue.SimpleQueue = queue.SimpleQueue()
        for env in [first, *(build_env(plan.env) for _ in range(plan.concurrency - 1))]:
            self._envs.put(env)

    def run(self, job: EpisodeJob) -> dict[str, Any]:
        """The record of one episode (the actor may run `concurrency` of these at once)."""
        models = self._models[job.arm or job.mode]
        env = self._envs.get()
        try:
            with ExitStack() as stack:
                if isinstance(self._pool, _BatchedPool):
                    stack.enter_context(self._pool.group.member())
                protocol = self._protocols.get(job.arm or job.mode, self.plan.protocol)
                ep, record = play_episode(env, job, models, protocol, model_names(models))
        except BaseException:
            env.close()  # it may be mid-episode: the next one gets a fresh environment
            self._envs.put(build_env(self.plan.env))
            raise
        if ep.tools_still_running:  # a timed-out call still runs in it (see run_tasks)
            env.close()
            env = build_env(self.plan.env)
        self._envs.put(env)
        return record


def run_jobs_on_ray(plan: EpisodePlan, jobs: Sequence[EpisodeJob], out_path: str | Path, executor: ExecutorConfig,
                    worker: type = EpisodeWorker) -> list[dict[str, Any]]:
    """Every job not yet in ``out_path``, on ``executor.actors`` actors running ``worker(plan)``;
    returns all records in the file. ``worker``: the class each actor runs (tests give one
    that dies)."""
    out_path = Path(out_path)
    records = resumable_records(out_path)
    done = {episode_key(r) for r in records}
    hazard = plan.env.rerun_hazard()
    journal = StartJournal(out_path, hazard)
    journal.check(done)
    todo = [job for job in jobs if job.key not in done]
    if not todo:
        return records
    started = connect(executor)
    try:
        with ActorPool(worker, (plan,), executor, per_actor=plan.concurrency,
                       no_resubmit=hazard) as pool:
            progress = Progress("episodes")
            records += _gather(pool, todo, out_path, done, progress, journal)
            print(progress.line(pool), file=sys.stderr)
    finally:
        shutdown_if(started)
    return records


def _gather(pool: ActorPool, todo: Sequence[EpisodeJob], out_path: Path, done: set, progress: Progress,
            journal: StartJournal) -> list[dict[str, Any]]:
    """Append each record as it arrives, once per resume key."""
    new = []
    with out_path.open("a") as sink, progress_bar(total=len(todo), desc="episodes on ray", unit="ep") as bar:
        for job, record in pool.map("run", todo, on_submit=journal.mark):
            if job.key in done:  # the pool hands a result over once; a key is never written twice
                continue
            append_record(sink, record)
            done.add(job.key)
            new.append(record)
            progress.add(1, engine_seconds(record))
            bar.set_postfix(arm=job.arm or job.mode, reward=record["reward"], lost=pool.stats.actors_lost, refresh=False)
            bar.update()
    return new


def engine_seconds(record: dict[str, Any]) -> float:
    """Seconds an episode waited on its models (every model and role of its ledger)."""
    return sum(stats["seconds"] for roles in record["ledger"].values() for stats in roles.values())
