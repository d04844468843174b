"""`specagent mine`: the weak drafter's own segments at every cut point of strong runs, labeled.

The drafting and labeling are the runtime's (`runtime/drafting.py`, shared with the
training-time acceptance callback). This module is the resumable loop around them: work
is done a group of trajectories at a time (all their cut points in one batched draft)
and appended to a shard file, one line per finished trajectory: a killed run resumes at
the next trajectory, and `--shard i/N` splits trajectories by a stable hash so that N
machines mine in parallel and `finalize` builds the same datasets from the shard files
as one run would.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TextIO

from specagent.config import MineConfig
from specagent.core.draft import DraftJob
from specagent.core.interfaces import ChatEngine, Environment
from specagent.core.types import Trajectory
from specagent.records.base import jsonl_lines
from specagent.records.segments import ShardRow
from specagent.runtime.drafting import DraftSettings, DraftStats, draft_trajectories
from specagent.runtime.progress import progress
from specagent.runtime.ray_pool import ActorPool, Progress, connect, require_ray, shutdown_if  # ray itself: lazily


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> "Shard":
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise ValueError(f"shard {text!r} must look like i/N, e.g. 0/4") from None
        if not (n > 0 and 0 <= i < n):
            raise ValueError(f"shard {text!r}: need 0 <= i < N")
        return cls(i, n)

    def owns(self, trajectory_id: str) -> bool:
        digest = hashlib.sha256(trajectory_id.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index

    @property
    def filename(self) -> str:
        return f"shard-{self.index:03d}-of-{self.count:03d}.jsonl"


# --------------------------------------------------------------------- the resumable loop

def finished_ids(path: Path) -> set[str]:
    """Trajectory ids already in a shard file; a torn last line is cut off."""
    if not path.exists():
        return set()
    good, done = [], set()
    for number, line in jsonl_lines(path, "shard file"):
        try:
            raw = json.loads(line)
        except json.JSONDecodeError:
            break  # a torn last line: that trajectory is mined again
        done.add(ShardRow.parse(raw, f"{path}:{number}").trajectory_id)
        good.append(line)
    path.write_text("".join(g + "\n" for g in good))
    return done


def mine_group(
    group: Sequence[Trajectory],
    drafter: ChatEngine,
    jobs_for: Callable[[Trajectory, Sequence[int]], list[DraftJob]],
    settings: DraftSettings,
    stats: DraftStats,
    strong: ChatEngine | None = None,
    restore_for: Callable[[Trajectory, int], Callable[[], Environment]] | None = None,
) -> list[ShardRow]:
    """The shard rows of a group of trajectories, all their cut points drafted in one batch:
    the unit of work of a mining worker, in this process (`mine_shard`) and in a Ray actor alike."""
    engine_before, group_start = stats.seconds_in_engines, time.perf_counter()
    mined = draft_trajectories(group, drafter, jobs_for, settings, stats, strong, restore_for)
    share = 1 / len(group)  # a group's engine and wall time, split evenly over its trajectories
    return [ShardRow(trajectory_id=traj.id, segments=segments,
                     seconds_in_engines=(stats.seconds_in_engines - engine_before) * share,
                     wall_seconds=(time.perf_counter() - group_start) * share)
            for traj, segments in zip(group, mined)]


def append_rows(sink: TextIO, rows: Sequence[ShardRow]) -> None:
    """A group's rows, whole lines on disk before the next group: what a killed run resumes from."""
    for row in rows:
        sink.write(json.dumps(row.dump()) + "\n")
    sink.flush()
    os.fsync(sink.fileno())


def pending(trajectories: Sequence[Trajectory], path: Path, shard: Shard) -> list[Trajectory]:
    """This shard's trajectories not yet in its file (a torn last line cut off), in file order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = finished_ids(path)
    return [t for t in trajectories if shard.owns(t.id) and t.id not in done]


def groups_of(trajectories: Sequence[Trajectory], size: int) -> list[list[Trajectory]]:
    """Consecutive groups of ``size`` trajectories (the last one shorter): the work items."""
    return [list(trajectories[i : i + size]) for i in range(0, len(trajectories), size)]


def mine_shard(
    trajectories: Sequence[Trajectory],
    drafter: ChatEngine,
    jobs_for: Callable[[Trajectory, Sequence[int]], list[DraftJob]],
    settings: DraftSettings,
    work_dir: Path,
    shard: Shard = Shard(),
    strong: ChatEngine | None = None,
    restore_for: Callable[[Trajectory, int], Callable[[], Environment]] | None = None,
) -> tuple[Path, DraftStats]:
    """Mine this shard's trajectories into ``work_dir/shard-i-of-N.jsonl``, skipping done ones."""
    path = work_dir / shard.filename
    mine = pending(trajectories, path, shard)
    stats = DraftStats()
    start = time.perf_counter()
    with path.open("a") as sink, progress(total=len(mine), desc=f"mining shard {shard.index}/{shard.count}",
                                          unit="traj") as bar:
        for group in groups_of(mine, settings.batch_trajectories):
            append_rows(sink, mine_group(group, drafter, jobs_for, settings, stats, strong, restore_for))
            bar.update(len(group))
    stats.extra["wall_seconds"] = time.perf_counter() - start
    stats.extra["trajectories_mined_now"] = len(mine)
    return path, stats


def mine_shard_on_ray(trajectories: Sequence[Trajectory], worker: type, cfg: MineConfig, work_dir: Path,
                      shard: Shard = Shard()) -> Path:
    """`mine_shard` with the groups (of ``cfg.batch_trajectories``) mined by ``cfg.executor``'s
    Ray actors, each running ``worker(cfg, trajectories)`` (its ``mine(trajectory_ids)``
    gives a group's rows). The driver appends each group's rows as they arrive, into the
    same shard file, so the datasets equal a single process's and a killed driver resumes at
    the next unmined trajectory."""
    path = work_dir / shard.filename
    groups = [tuple(t.id for t in g) for g in groups_of(pending(trajectories, path, shard), cfg.batch_trajectories)]
    if not groups:
        return path
    started = connect(cfg.executor)
    try:
        args = (cfg, require_ray().put(list(trajectories)))  # one copy in the object store, not one per actor
        with ActorPool(worker, args, cfg.executor) as pool:
            figures = _append_as_mined(pool, groups, path, f"mining shard {shard.index}/{shard.count} on ray")
        print(figures.line(pool))
    finally:
        shutdown_if(started)
    return path


def _append_as_mined(pool: ActorPool, groups: list[tuple[str, ...]], path: Path, desc: str) -> Progress:
    """Each group's rows appended as they arrive, a trajectory never twice; the driver's figures."""
    figures, done = Progress("segments"), set()
    with path.open("a") as sink, progress(total=sum(map(len, groups)), desc=desc, unit="traj") as bar:
        for ids, raw in pool.map("mine", groups):
            rows = [ShardRow.parse(r, f"actor result for {r.get('trajectory_id')}") for r in raw]
            append_rows(sink, [r for r in rows if r.trajectory_id not in done])
            done.update(ids)
            figures.add(sum(len(r.segments) for r in rows), sum(r.seconds_in_engines for r in rows))
            bar.set_postfix(lost=pool.stats.actors_lost, refresh=False)
            bar.update(len(ids))
    return figures
