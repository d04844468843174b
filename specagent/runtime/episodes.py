"""Run episodes over a task list and append them to `episodes.jsonl`, resumably.

Each line is one finished episode (format `specagent.episode/v1`); a rerun skips the
(task, arm, trial) triples already on disk (the arm is the mode outside an eval), so a
killed run continues where it stopped.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TextIO

from specagent.core.errors import SpecAgentError, TaskFileError
from specagent.core.interfaces import Environment
from specagent.core.protocol import Episode, Models, ProtocolConfig, run_episode
from specagent.engines.batching import BatchingEngine, CallerGroup
from specagent.records.base import read_jsonl
from specagent.records.episodes import EpisodeRecord, StartedEpisode
from specagent.runtime.progress import progress


def episode_record(ep: Episode, trial: int, models: dict[str, str], arm: str | None = None) -> dict[str, Any]:
    """The `specagent.episode/v1` object of a finished episode."""
    return EpisodeRecord.of(ep, trial, models, arm).dump()


def episode_key(record: dict[str, Any]) -> tuple[str, str, int]:
    """(task, arm, trial); the arm of a `specagent run` episode is its mode."""
    return (str(record["task_id"]), record["arm"], int(record["trial"]))


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """The finished episodes in a file, each checked as an `EpisodeRecord`. A torn last line (a
    killed write) is dropped; any other line that is not an episode raises ``TaskFileError``
    naming file, line and field."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        return [r.dump() for r in read_jsonl(path, EpisodeRecord, "episodes file", torn_tail_ok=True)]
    except TaskFileError as err:
        raise TaskFileError(f"{err}; the file is corrupt: delete that line (its episode reruns) or the file "
                            "(every episode reruns)") from None


class StartJournal:
    """Which episodes started, beside the episodes file, for environments where running an
    episode again does not start from a fresh state (`EnvConfig.rerun_hazard`: an MCP server
    that keeps what it was told). An episode that started and never finished (a killed run)
    may have made its writes; a resume does not run it again until the user has looked at
    the server and deleted its line here (or the file)."""

    def __init__(self, episodes_path: Path, hazard: str | None) -> None:
        self.path = episodes_path.with_name(episodes_path.stem + ".started.jsonl")
        self.hazard = hazard

    def check(self, done: set[tuple[str, str, int]]) -> None:
        """Raise when an episode started and did not finish; nothing to do without a hazard.
        Called before a run's first start: a torn last line (a killed start) is cut off."""
        if self.hazard is None or not self.path.exists():
            return
        lines = read_jsonl(self.path, StartedEpisode, "episode start journal", torn_tail_ok=True)
        # the next start is appended after whole lines: glued to a torn line, it would be torn too
        _rewrite_without_torn_tail(self.path, [line.dump() for line in lines])
        interrupted = sorted({(e.task_id, e.arm, e.trial) for e in lines} - done)
        if interrupted:
            named = ", ".join(f"task {t} ({arm}, trial {trial})" for t, arm, trial in interrupted[:5])
            more = f" and {len(interrupted) - 5} more" if len(interrupted) > 5 else ""
            raise SpecAgentError(
                f"{len(interrupted)} episode(s) started and never finished: {named}{more}. {self.hazard}. Check "
                f"that state; then delete their lines in {self.path} (or the file) to run them again")

    def mark(self, job: "EpisodeJob") -> None:
        """On disk before the episode's first tool call."""
        if self.hazard is None:
            return
        task_id, arm, trial = job.key
        with self.path.open("a") as sink:
            append_record(sink, StartedEpisode(task_id=task_id, arm=arm, trial=trial).dump())


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: a task in a mode, its trial, and the eval arm it belongs to."""

    task: str
    mode: str
    trial: int
    arm: str | None = None  # None outside an eval: the arm is the mode

    @property
    def key(self) -> tuple[str, str, int]:
        """The resume key of its record (`episode_key`)."""
        return (str(self.task), self.arm or self.mode, self.trial)


def play_episode(env: Environment, job: EpisodeJob, models: Models, protocol: ProtocolConfig,
                 model_names: dict[str, str]) -> tuple[Episode, dict[str, Any]]:
    """One episode and its record: the unit of work of `run`, `collect` and `eval`, in this
    process (`run_tasks`) and in a Ray actor (`EpisodeWorker`) alike."""
    ep = run_episode(env, job.task, job.mode, models, protocol)
    return ep, episode_record(ep, job.trial, model_names, job.arm)


def append_record(sink: TextIO, record: dict[str, Any]) -> None:
    """One whole line, on disk before the next: what a killed run resumes from."""
    sink.write(json.dumps(record) + "\n")
    sink.flush()
    os.fsync(sink.fileno())


def episode_jobs(task_ids: Sequence[str], modes: Iterable[str], trials: int, arm: str | None = None) -> list[EpisodeJob]:
    """Every episode of a run, in the order a single process runs them: trial, mode, task."""
    return [EpisodeJob(str(task), mode, trial, arm) for trial in range(trials) for mode in modes for task in task_ids]


def resumable_records(path: Path) -> list[dict[str, Any]]:
    """The finished episodes of ``path`` (created with its folder if missing), its torn last
    line cut off, so that new records append after whole lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    records = read_episodes(path)
    _rewrite_without_torn_tail(path, records)
    return records


def _rewrite_without_torn_tail(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


def run_tasks(
    env: Environment,
    task_ids: Sequence[str],
    modes: Iterable[str],
    models: Models,
    protocol: ProtocolConfig,
    out_path: str | Path,
    trials: int = 1,
    model_names: dict[str, str] | None = None,
    on_episode: Callable[[Episode, dict[str, Any]], None] | None = None,
    arm: str | None = None,
    concurrency: int = 1,
    env_factory: Callable[[], Environment] | None = None,
    rerun_hazard: str | None = None,
) -> list[dict[str, Any]]:
    """Run every (trial, mode, task) not yet in ``out_path``; returns all records in the file.

    ``arm`` names the episodes of an eval arm (one mode per call): it replaces the mode in
    the records' `arm` field and in the resume key.

    ``concurrency`` N > 1 runs N episodes side by side, one per thread, each thread on its own
    environment (``env``, and N-1 made by ``env_factory`` and closed at the end: an
    environment holds one episode at a time). The threads share the engines in ``models``,
    which must be safe to call from threads: put local engines behind `BatchingEngine`s
    (`batching_engines`), whose engine calls then carry the requests of all the episodes.
    Records are appended whole, in the order episodes finish. After an error the other
    threads finish their episodes (kept on disk) and stop; then the error is raised.

    ``rerun_hazard`` (`EnvConfig.rerun_hazard`): why an interrupted episode must not simply
    run again; the episodes' starts are then journalled (`StartJournal`)."""
    if concurrency > 1 and env_factory is None:
        raise ValueError("run_tasks: concurrency > 1 needs env_factory (one environment per thread)")
    out_path = Path(out_path)
    records = resumable_records(out_path)
    done = {episode_key(r) for r in records}
    journal = StartJournal(out_path, rerun_hazard)
    journal.check(done)
    todo = [job for job in episode_jobs(task_ids, modes, trials, arm) if job.key not in done]
    lock = threading.Lock()
    with out_path.open("a") as sink, progress(total=len(todo), desc=arm or "episodes", unit="ep") as bar:

        def run_one(env: Environment, job: EpisodeJob) -> Environment:
            with lock:
                journal.mark(job)
            ep, record = play_episode(env, job, models, protocol, model_names or {})
            with lock:  # one whole line at a time
                append_record(sink, record)
                records.append(record)
                if on_episode is not None:
                    on_episode(ep, record)
                bar.set_postfix(task=job.task, mode=job.mode, reward=ep.reward, refresh=False)  # drawn by update()
                bar.update()
            if not ep.tools_still_running:
                return env
            # a timed-out call still runs in this environment: its late effect must not land in
            # the next episode's state, so the next episode gets a fresh environment
            if env_factory is None:
                raise SpecAgentError(f"task {job.task}: tool call(s) {', '.join(ep.tools_still_running)} timed out and "
                                     "still run in the environment, which cannot be reused; give run_tasks an "
                                     "env_factory")
            with lock:
                owned.append(env_factory())
                return owned[-1]

        owned = [env_factory() for _ in range(min(concurrency, len(todo)) - 1)] if env_factory else []
        first = list(owned)
        try:
            _run_in_threads(todo, run_one, [env, *first], _caller_groups(models))
        finally:
            for made in owned:  # the caller's `env` stays the caller's
                made.close()
    return records


def _caller_groups(models: Models) -> set[CallerGroup]:
    return {engine.group for engine in (models.strong, models.weak) if isinstance(engine, BatchingEngine)}


def _run_in_threads(
    todo: list[EpisodeJob], run_one: Callable[..., Environment], envs: list[Environment], groups: set[CallerGroup]
) -> None:
    """One thread per environment takes the next episode job until none is left or one
    failed (a single environment runs in the calling thread). Each thread is a member of the
    batching engines' caller groups, so a batch goes as soon as every episode waits."""
    queue = iter(todo)
    lock = threading.Lock()
    stop = threading.Event()
    enrolled = threading.Barrier(len(envs))

    def work(env: Environment) -> None:
        with ExitStack() as stack:
            for group in groups:
                stack.enter_context(group.member())
            enrolled.wait()  # all are members before the first request, so the first batch waits for all
            while not stop.is_set():
                with lock:
                    item = next(queue, None)
                if item is None:
                    return
                try:
                    env = run_one(env, item)
                except BaseException:
                    stop.set()
                    raise

    if len(envs) == 1:
        work(envs[0])
        return
    pool = ThreadPoolExecutor(len(envs), thread_name_prefix="episode")
    futures = [pool.submit(work, env) for env in envs]
    try:
        for future in futures:
            future.result()
    finally:
        stop.set()  # after an error or Ctrl-C, the others stop after their current episode
        pool.shutdown()
