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
from typing import Callable, Sequence

from tqdm import tqdm

from specagent.core.draft import DraftJob
from specagent.core.interfaces import ChatEngine, Environment
from specagent.core.types import Trajectory
from specagent.records.base import jsonl_lines
from specagent.records.segments import ShardRow
from specagent.runtime.drafting import DraftSettings, DraftStats, draft_trajectories


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


# --------------------------------------------------------------------- environments at a cut point


# --------------------------------------------------------------------- one trajectory


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
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / shard.filename
    done = finished_ids(path)
    mine = [t for t in trajectories if shard.owns(t.id) and t.id not in done]
    stats = DraftStats()
    start = time.perf_counter()
    groups = [mine[i : i + settings.batch_trajectories] for i in range(0, len(mine), settings.batch_trajectories)]
    with path.open("a") as sink, tqdm(total=len(mine), desc=f"mining shard {shard.index}/{shard.count}",
                                      unit="traj") as bar:
        for group in groups:
            engine_before, group_start = stats.seconds_in_engines, time.perf_counter()
            mined = draft_trajectories(group, drafter, jobs_for, settings, stats, strong, restore_for)
            share = 1 / len(group)  # a group's engine and wall time, split evenly over its trajectories
            for traj, segments in zip(group, mined):
                row = ShardRow(trajectory_id=traj.id, segments=segments,
                               seconds_in_engines=(stats.seconds_in_engines - engine_before) * share,
                               wall_seconds=(time.perf_counter() - group_start) * share)
                sink.write(json.dumps(row.dump()) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            bar.update(len(group))
    stats.extra["wall_seconds"] = time.perf_counter() - start
    stats.extra["trajectories_mined_now"] = len(mine)
    return path, stats
