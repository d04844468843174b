"""`specagent mine`: the weak drafter's own segments at every cut point of strong runs, labeled.

For each trajectory and each assistant step of the strong model (a cut point), the
drafter drafts from the context before it under the DRAFT rules (core/draft.py):
read-only steps executed (replayed from the log, or run for real in a live
environment restored to the cut point), the first state-changing step held. Every
drafted step is then labeled (`match`, `judge`, `rollout`), prefix-closed.

Work is done one trajectory at a time (all its cut points in one batched draft) and
appended to a shard file, one line per finished trajectory: a killed run resumes at
the next trajectory, and `--shard i/N` splits trajectories by a stable hash so that N
machines mine in parallel and `finalize` builds the same datasets from the shard
files as one run would.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from specagent.core.classify import classify_tools, step_kind
from specagent.core.draft import DraftJob, draft_batch
from specagent.core.interfaces import ChatEngine, Environment
from specagent.core.types import DraftedStep, Message, Segment, StepKind, ToolCall, Trajectory, Usage
from specagent.data.labelers import judge_labels, match_labels, reference_steps, rollout_labels

SEGMENT_FORMAT = "specagent.segment/v1"


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


@dataclass
class MineSettings:
    labelers: tuple[str, ...] = ("match",)
    window: int = 4
    max_draft_steps: int = 4
    max_tokens: int = 192
    drafter_adapter: str | None = None
    read_only: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    judge_max_tokens: int = 8
    max_cuts: int | None = None
    rollout_steps: int = 8
    reference_segments: bool = False
    batch_trajectories: int = 1  # trajectories drafted together in one engine batch


@dataclass
class MineStats:
    seconds_in_engines: float = 0.0
    draft_calls: int = 0
    draft_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------- environments at a cut point

def replay_jobs(env: Any, traj: Trajectory, cuts: Sequence[int], budget: int) -> list[DraftJob]:
    """Draft jobs over a ReplayEnv: each cut point sees the recorded state at that point."""
    env.reset(traj.id)

    def at(cut: int) -> tuple[Callable[[ToolCall], Message], Callable[[ToolCall], bool]]:
        def execute(call: ToolCall) -> Message:
            env.seek(cut)
            return Message(role="tool", content=env.execute(call), tool_call_id=call.id, name=call.name)

        def can_execute(call: ToolCall) -> bool:
            env.seek(cut)
            return env.is_recorded(call)

        return execute, can_execute

    jobs = []
    for cut in cuts:
        execute, can = at(cut)
        jobs.append(DraftJob(traj.messages[:cut], execute, budget, can))
    return jobs


def restore(make_env: Callable[[], Environment], traj: Trajectory, cut: int, read_only: dict[str, bool]) -> Environment:
    """A fresh live environment in the state of the trajectory at its cut point: the run's
    state-changing calls before the cut, replayed in order."""
    env = make_env()
    env.reset(traj.task_id)
    for message in traj.messages[:cut]:
        for call in message.tool_calls:
            if not read_only.get(call.name, False):
                env.execute(call)
    return env


def live_jobs(make_env: Callable[[], Environment], traj: Trajectory, cuts: Sequence[int], budget: int,
              read_only: dict[str, bool]) -> list[DraftJob]:
    """Draft jobs in a live environment: a fresh one per cut point, restored to the cut;
    drafted lookups run for real."""
    jobs = []
    for cut in cuts:
        env = restore(make_env, traj, cut, read_only)

        def execute(call: ToolCall, env: Environment = env) -> Message:
            return Message(role="tool", content=env.execute(call), tool_call_id=call.id, name=call.name)

        jobs.append(DraftJob(traj.messages[:cut], execute, budget))
    return jobs


# --------------------------------------------------------------------- one trajectory

def cut_points(traj: Trajectory, max_cuts: int | None = None) -> list[int]:
    """Indices of the strong model's assistant messages (after the opening user turn);
    with ``max_cuts``, that many evenly spaced ones (deterministic)."""
    first_user = next((i for i, m in enumerate(traj.messages) if m.role == "user"), len(traj.messages))
    cuts = [i for i, m in enumerate(traj.messages) if m.role == "assistant" and i > first_user]
    if max_cuts is None or len(cuts) <= max_cuts:
        return cuts
    return [cuts[round(k * (len(cuts) - 1) / max(max_cuts - 1, 1))] for k in range(max_cuts)]


def step_json(step: DraftedStep) -> dict[str, Any]:
    return {
        "message": step.message.to_openai(),
        "kind": step.kind.value,
        "observations": [o.to_openai() for o in step.observations],
        "malformed": step.malformed,
    }


def step_from_json(raw: dict[str, Any]) -> DraftedStep:
    return DraftedStep(
        message=Message.from_openai(raw["message"]),
        kind=StepKind(raw["kind"]),
        observations=tuple(Message.from_openai(o) for o in raw["observations"]),
        malformed=raw["malformed"],
    )


def mine_trajectory(
    traj: Trajectory,
    drafter: ChatEngine,
    jobs_for: Callable[[Trajectory, Sequence[int]], list[DraftJob]],
    settings: MineSettings,
    stats: MineStats,
    strong: ChatEngine | None = None,
    restore_for: Callable[[Trajectory, int], Callable[[], Environment]] | None = None,
) -> list[dict[str, Any]]:
    """Segments for every cut point of one trajectory, drafted in one batch, labeled."""
    return mine_trajectories([traj], drafter, jobs_for, settings, stats, strong, restore_for)[0]


def mine_trajectories(
    trajs: Sequence[Trajectory],
    drafter: ChatEngine,
    jobs_for: Callable[[Trajectory, Sequence[int]], list[DraftJob]],
    settings: MineSettings,
    stats: MineStats,
    strong: ChatEngine | None = None,
    restore_for: Callable[[Trajectory, int], Callable[[], Environment]] | None = None,
) -> list[list[dict[str, Any]]]:
    """Segments of several trajectories: every cut point of all of them drafted in one batch
    (the engine batches across trajectories), then labeled per trajectory."""
    cuts_of = [cut_points(traj, settings.max_cuts) for traj in trajs]

    def on_usage(usage: Usage) -> None:
        stats.seconds_in_engines += usage.seconds
        stats.draft_calls += 1
        stats.draft_tokens += usage.completion_tokens

    segments_of: list[list[Segment]] = [[] for _ in trajs]
    by_tools: dict[str, list[int]] = {}  # draft_batch takes one tool list: group by identical tools
    for n, traj in enumerate(trajs):
        if cuts_of[n]:
            by_tools.setdefault(json.dumps([t.to_openai() for t in traj.tools], sort_keys=True), []).append(n)
    for members in by_tools.values():
        jobs, owners = [], []
        for n in members:
            made = jobs_for(trajs[n], cuts_of[n])
            jobs += made
            owners += [n] * len(made)
        first = trajs[members[0]]
        read_only = classify_tools(first.tools, settings.read_only, settings.write, strict=False)
        drafted = draft_batch(drafter, jobs, first.tools, read_only, settings.max_tokens,
                              settings.drafter_adapter, on_usage)
        for n, seg in zip(owners, drafted):
            segments_of[n].append(seg)
    return [label_trajectory(traj, cuts, segs, settings, stats, strong, restore_for) if cuts else []
            for traj, cuts, segs in zip(trajs, cuts_of, segments_of)]


def label_trajectory(
    traj: Trajectory,
    cuts: Sequence[int],
    segments: Sequence[Segment],
    settings: MineSettings,
    stats: MineStats,
    strong: ChatEngine | None,
    restore_for: Callable[[Trajectory, int], Callable[[], Environment]] | None,
) -> list[dict[str, Any]]:
    """Labels of one trajectory's drafted segments by every configured labeler; the records."""
    read_only = classify_tools(traj.tools, settings.read_only, settings.write, strict=False)
    references = [reference_steps(traj.messages, cut) for cut in cuts]
    labels: dict[str, list[list[int]]] = {}
    if "match" in settings.labelers:
        labels["match"] = [match_labels(seg.steps, ref, read_only, settings.window)
                           for seg, ref in zip(segments, references)]
    if "judge" in settings.labelers:
        if strong is None:
            raise ValueError("the judge labeler needs the strong model (mine config: strong)")
        start = time.perf_counter()
        judged = judge_labels(strong, [(traj.messages[:c], s.steps, r) for c, s, r in zip(cuts, segments, references)],
                              traj.tools, settings.judge_max_tokens)
        stats.seconds_in_engines += time.perf_counter() - start
        labels["judge"] = [j[0] for j in judged]
    if "rollout" in settings.labelers:
        if strong is None or restore_for is None:
            raise ValueError("the rollout labeler needs the strong model and a live environment")
        start = time.perf_counter()
        labels["rollout"] = [
            rollout_labels(restore_for(traj, cut), traj.task_id, traj.messages[:cut], seg.steps, strong,
                           settings.rollout_steps, settings.max_tokens)[0]
            for cut, seg in zip(cuts, segments)
        ]
        stats.seconds_in_engines += time.perf_counter() - start
    records = []
    for n, (cut, seg, ref) in enumerate(zip(cuts, segments, references)):
        records.append(segment_record(traj, cut, seg, ref, {k: v[n] for k, v in labels.items()}, settings))
    if settings.reference_segments:
        for cut, ref in zip(cuts, references):
            seg = reference_segment(traj, cut, read_only, settings.max_draft_steps)
            if seg.steps:
                ones = [1] * len(seg.steps)
                record = segment_record(traj, cut, seg, ref, {settings.labelers[0]: ones}, settings)
                records.append({**record, "id": record["id"] + ":reference", "label_source": "reference",
                                "all_labels": {"reference": ones}})
    return records


def reference_segment(traj: Trajectory, cut: int, read_only: dict[str, bool], max_steps: int) -> Segment:
    """The strong model's own next steps at a cut, cut by the DRAFT rules (lookups with their
    recorded observations, then the first held step): valid by construction. They give a
    verdict model positives where the weak drafter has few; they are not drafts and are
    left out of acceptance figures."""
    steps, i, messages = [], cut, traj.messages
    while i < len(messages) and messages[i].role == "assistant" and len(steps) < max_steps:
        message = messages[i]
        kind = step_kind(message, read_only)
        j = i + 1
        while j < len(messages) and messages[j].role == "tool":
            j += 1
        observations = tuple(messages[i + 1 : j]) if kind is StepKind.READ else ()
        steps.append(DraftedStep(message, kind, observations))
        if kind is not StepKind.READ:
            return Segment(cut, tuple(steps), "held")
        i = j
    return Segment(cut, tuple(steps), "max_steps" if len(steps) >= max_steps else "end")


def segment_record(traj: Trajectory, cut: int, seg: Segment, reference: list[Message],
                   labels: dict[str, list[int]], settings: MineSettings) -> dict[str, Any]:
    primary = settings.labelers[0]
    return {
        "format": SEGMENT_FORMAT,
        "id": f"{traj.id}@{cut}",
        "trajectory_id": traj.id,
        "task_id": traj.task_id,
        "cut": cut,
        "steps": [step_json(s) for s in seg.steps],
        "ended_by": seg.ended_by,
        "unrecorded": list(seg.unrecorded),
        "labels": labels[primary],
        "label_source": primary,
        "all_labels": labels,
        "reference": [m.to_openai() for m in reference[: settings.window]],
        "strong_reward": traj.reward,
    }


# --------------------------------------------------------------------- the resumable loop

def finished_ids(path: Path) -> set[str]:
    """Trajectory ids already in a shard file; a torn last line is cut off."""
    if not path.exists():
        return set()
    good, done = [], set()
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        good.append(line)
        done.add(row["trajectory_id"])
    path.write_text("".join(g + "\n" for g in good))
    return done


def mine_shard(
    trajectories: Sequence[Trajectory],
    drafter: ChatEngine,
    jobs_for: Callable[[Trajectory, Sequence[int]], list[DraftJob]],
    settings: MineSettings,
    work_dir: Path,
    shard: Shard = Shard(),
    strong: ChatEngine | None = None,
    restore_for: Callable[[Trajectory, int], Callable[[], Environment]] | None = None,
) -> tuple[Path, MineStats]:
    """Mine this shard's trajectories into ``work_dir/shard-i-of-N.jsonl``, skipping done ones."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / shard.filename
    done = finished_ids(path)
    mine = [t for t in trajectories if shard.owns(t.id) and t.id not in done]
    stats = MineStats()
    start = time.perf_counter()
    groups = [mine[i : i + settings.batch_trajectories] for i in range(0, len(mine), settings.batch_trajectories)]
    with path.open("a") as sink, tqdm(total=len(mine), desc=f"mining shard {shard.index}/{shard.count}",
                                      unit="traj") as bar:
        for group in groups:
            engine_before, group_start = stats.seconds_in_engines, time.perf_counter()
            mined = mine_trajectories(group, drafter, jobs_for, settings, stats, strong, restore_for)
            share = 1 / len(group)  # a group's engine and wall time, split evenly over its trajectories
            for traj, segments in zip(group, mined):
                row = {"trajectory_id": traj.id, "segments": segments,
                       "seconds_in_engines": (stats.seconds_in_engines - engine_before) * share,
                       "wall_seconds": (time.perf_counter() - group_start) * share}
                sink.write(json.dumps(row) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            bar.update(len(group))
    stats.extra["wall_seconds"] = time.perf_counter() - start
    stats.extra["trajectories_mined_now"] = len(mine)
    return path, stats
