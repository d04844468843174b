"""Drafting at the cut points of strong trajectories, labeled: what mining and the
training-time acceptance callback share (DESIGN §1-§3).

For each cut point (an assistant step of the strong model) the drafter drafts from the
context before it under the DRAFT rules (`core/draft.py`): read-only steps executed
(replayed from the log, or run for real in a live environment restored to the cut
point), the first state-changing step held. Every drafted step is then labeled (`match`,
`judge`, `rollout`; prefix-closed), and `segment_stats` gives the figures of DESIGN §3.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from specagent.core.classify import classify_tools, step_kind
from specagent.core.draft import DraftJob, draft_batch
from specagent.core.interfaces import ChatEngine, Environment
from specagent.core.types import DROPPED_STEP, DraftedStep, Message, Segment, StepKind, ToolCall, Trajectory, Usage
from specagent.records.segments import DraftedStepRecord, SegmentRecord
from specagent.runtime.labelers import RolloutJob, judge_labels, match_labels, reference_steps, rollout_labels_many
from specagent.runtime.progress import progress

# how a mining run makes the draft jobs of a trajectory's cut points, and restores a live env
JobsFor = Callable[[Trajectory, Sequence[int]], list[DraftJob]]
RestoreFor = Callable[[Trajectory, int], Callable[[], Environment]]


@dataclass
class DraftSettings:
    labelers: tuple[str, ...] = ("match",)
    window: int = 4
    max_draft_steps: int = 4
    max_tokens: int = 192
    draft_stop_below: float = 0.0  # the runtime's stop rule (ProtocolSettings.draft_stop_below)
    draft_stop_repeats: bool = False  # the runtime's repeat rule (ProtocolSettings.draft_stop_repeats)
    drafter_adapter: str | None = None
    read_only: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    judge_max_tokens: int = 8
    max_cuts: int | None = None
    rollout_steps: int = 8
    rollout_concurrency: int = 1  # rollouts run side by side, their strong requests batched
    rollout_min_reward: float = 1.0  # a drafted prefix is valid only if the rollout after it scores this
    rollout_max_extra_steps: int | None = None  # ... and ends within this many agent steps of the baseline
    rollout_failed_calls_invalid: bool = False  # ... and none of its calls failed
    reference_segments: bool = False
    batch_trajectories: int = 1  # trajectories drafted together in one engine batch


@dataclass
class DraftStats:
    seconds_in_engines: float = 0.0
    draft_calls: int = 0
    draft_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


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


def cut_points(traj: Trajectory, max_cuts: int | None = None) -> list[int]:
    """Indices of the strong model's assistant messages (after the opening user turn);
    with ``max_cuts``, that many evenly spaced ones (deterministic)."""
    first_user = next((i for i, m in enumerate(traj.messages) if m.role == "user"), len(traj.messages))
    cuts = [i for i, m in enumerate(traj.messages) if m.role == "assistant" and i > first_user]
    if max_cuts is None or len(cuts) <= max_cuts:
        return cuts
    return [cuts[round(k * (len(cuts) - 1) / max(max_cuts - 1, 1))] for k in range(max_cuts)]


def draft_trajectory(
    traj: Trajectory,
    drafter: ChatEngine,
    jobs_for: JobsFor,
    settings: DraftSettings,
    stats: DraftStats,
    strong: ChatEngine | None = None,
    restore_for: RestoreFor | None = None,
) -> list[dict[str, Any]]:
    """Segments for every cut point of one trajectory, drafted in one batch, labeled."""
    return draft_trajectories([traj], drafter, jobs_for, settings, stats, strong, restore_for)[0]


def draft_trajectories(
    trajs: Sequence[Trajectory],
    drafter: ChatEngine,
    jobs_for: JobsFor,
    settings: DraftSettings,
    stats: DraftStats,
    strong: ChatEngine | None = None,
    restore_for: RestoreFor | None = None,
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
                              settings.drafter_adapter, on_usage, settings.draft_stop_below,
                              stop_repeats=settings.draft_stop_repeats)
        for n, seg in zip(owners, drafted):
            segments_of[n].append(seg)
    rollouts = (rollout_labels_of(trajs, cuts_of, segments_of, settings, stats, strong, restore_for)
                if "rollout" in settings.labelers else [None] * len(trajs))
    return [label_trajectory(traj, cuts, segs, settings, stats, strong, restore_for, rolled) if cuts else []
            for traj, cuts, segs, rolled in zip(trajs, cuts_of, segments_of, rollouts)]


def rollout_labels_of(trajs: Sequence[Trajectory], cuts_of: Sequence[Sequence[int]],
                      segments_of: Sequence[Sequence[Segment]], settings: DraftSettings, stats: DraftStats,
                      strong: ChatEngine | None, restore_for: RestoreFor | None) -> list[list[list[int]]]:
    """`rollout` labels of every segment of the trajectories, their rollouts run together,
    ``settings.rollout_concurrency`` side by side (`rollout_labels_many`)."""
    if strong is None or restore_for is None:
        raise ValueError("the rollout labeler needs the strong model and a live environment")
    jobs = [RolloutJob(restore_for(traj, cut), traj.task_id, traj.messages[:cut], seg.steps)
            for traj, cuts, segs in zip(trajs, cuts_of, segments_of) for cut, seg in zip(cuts, segs)]
    start = time.perf_counter()
    total = sum(len(job.steps) + 1 for job in jobs)
    with progress(total=total, desc="rollouts", unit="ep", leave=False) as bar:
        labeled = rollout_labels_many(jobs, strong, settings.rollout_steps, settings.max_tokens,
                                      settings.rollout_concurrency, on_done=lambda: bar.update(1),
                                      min_reward=settings.rollout_min_reward,
                                      max_extra_steps=settings.rollout_max_extra_steps,
                                      failed_calls_invalid=settings.rollout_failed_calls_invalid)
    stats.seconds_in_engines += time.perf_counter() - start
    run = sum(reward is not None for _, rewards in labeled for reward in rewards)
    stats.extra["rollouts"] = stats.extra.get("rollouts", 0) + run  # those after a failed prefix are not run
    out, i = [], 0
    for segs in segments_of:
        out.append([labels for labels, _ in labeled[i: i + len(segs)]])
        i += len(segs)
    return out


def label_trajectory(
    traj: Trajectory,
    cuts: Sequence[int],
    segments: Sequence[Segment],
    settings: DraftSettings,
    stats: DraftStats,
    strong: ChatEngine | None,
    restore_for: RestoreFor | None,
    rollouts: list[list[int]] | None = None,
) -> list[dict[str, Any]]:
    """Labels of one trajectory's drafted segments by every configured labeler; the records.
    ``rollouts``: the segments' `rollout` labels when already computed (`rollout_labels_of`)."""
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
        labels["rollout"] = (rollouts if rollouts is not None else
                             rollout_labels_of([traj], [cuts], [segments], settings, stats, strong, restore_for)[0])
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


def after_step(messages: Sequence[Message], i: int) -> int:
    """The index after the step at ``messages[i]`` and the tool results recorded after it."""
    i += 1
    while i < len(messages) and messages[i].role == "tool":
        i += 1
    return i


def reference_segment(traj: Trajectory, cut: int, read_only: dict[str, bool], max_steps: int) -> Segment:
    """The strong model's own next steps at a cut, cut by the DRAFT rules (lookups with their
    recorded observations, then the first held step): valid by construction. They give a
    verdict model positives where the weak drafter has few; they are not drafts and are
    left out of acceptance figures."""
    steps, i, messages = [], cut, traj.messages
    while i < len(messages) and messages[i].role == "assistant" and len(steps) < max_steps:
        message = messages[i]
        kind = step_kind(message, read_only)
        j = after_step(messages, i)
        observations = tuple(messages[i + 1 : j]) if kind is StepKind.READ else ()
        steps.append(DraftedStep(message, kind, observations))
        if kind is not StepKind.READ:
            return Segment(cut, tuple(steps), "held")
        i = j
    return Segment(cut, tuple(steps), "max_steps" if len(steps) >= max_steps else "end")


def segment_record(traj: Trajectory, cut: int, seg: Segment, reference: list[Message],
                   labels: dict[str, list[int]], settings: DraftSettings) -> dict[str, Any]:
    """The `specagent.segment/v1` object of one drafted segment, labeled by every labeler."""
    primary = settings.labelers[0]
    return SegmentRecord(
        id=f"{traj.id}@{cut}", trajectory_id=traj.id, task_id=traj.task_id, cut=cut,
        steps=[DraftedStepRecord.of(s) for s in seg.steps], ended_by=seg.ended_by, unrecorded=list(seg.unrecorded),
        labels=labels[primary], label_source=primary, all_labels=labels,
        reference=[m.to_openai() for m in reference[: settings.window]], strong_reward=traj.reward,
    ).dump()


def step_tools(step: dict[str, Any]) -> list[str]:
    """The names a recorded drafted step (`DraftedStepRecord` as a dict) is counted under: its
    tool calls' names, or its kind (`reply`, `malformed`) when it calls none."""
    return [c["function"]["name"] for c in step["message"].get("tool_calls") or []] or [step["kind"]]


def segment_stats(segments: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mining figures with the metric definitions of DESIGN §3 (labels = accepted).

    A draft that ended at an unrecorded lookup (replay) drafted that lookup too: it counts
    as a drafted step that is not accepted (the strong run never made the call there), at
    the next position and under its tool. So does a draft ended by a repeated lookup
    (`draft_stop_repeats`), under `repeat`: the rule does not raise acceptance by leaving the
    drafter's repeats out of the count."""
    drafted = accepted = 0
    by_position: dict[int, Counter] = defaultdict(Counter)
    by_tool: dict[str, Counter] = defaultdict(Counter)
    ended = Counter(s["ended_by"] for s in segments)
    for seg in segments:
        scored = [(step_tools(step), label) for step, label in zip(seg["steps"], seg["labels"])]
        if seg["ended_by"] in DROPPED_STEP:  # shards mined before the field carry no names
            scored.append((seg.get("unrecorded") or [seg["ended_by"]], 0))
        for pos, (names, label) in enumerate(scored, 1):
            drafted += 1
            accepted += label
            by_position[pos].update(drafted=1, accepted=label)
            for name in names:
                by_tool[name].update(drafted=1, accepted=label)

    def rate(c: Counter) -> dict[str, Any]:
        return {"drafted": c["drafted"], "accepted": c["accepted"],
                "rate": c["accepted"] / c["drafted"] if c["drafted"] else None}

    prefixes = [sum(s["labels"]) for s in segments]
    return {
        "segments": len(segments),
        "drafted_steps": drafted,
        "accepted_steps": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_prefix": sum(prefixes) / len(prefixes) if prefixes else None,
        "label_balance": {"valid": accepted, "invalid": drafted - accepted},
        "ended_by": dict(sorted(ended.items())),
        "by_position": {str(k): rate(v) for k, v in sorted(by_position.items())},
        "by_tool": {k: rate(v) for k, v in sorted(by_tool.items())},
    }


# --------------------------------------------------------------------- from a mine config



def draft_settings(cfg: Any, **overrides: Any) -> DraftSettings:
    """The DRAFT and labeling rules of a mine config (`MineConfig`), as mining applies them."""
    settings = DraftSettings(
        labelers=tuple(cfg.labelers), window=cfg.window, max_draft_steps=cfg.protocol.max_draft_steps,
        max_tokens=cfg.protocol.max_tokens, draft_stop_below=cfg.protocol.draft_stop_below,
        draft_stop_repeats=cfg.protocol.draft_stop_repeats,
        drafter_adapter=cfg.drafter_adapter, max_cuts=cfg.max_cuts_per_trajectory,
        rollout_steps=cfg.rollout_steps, rollout_concurrency=cfg.rollout_concurrency,
        rollout_min_reward=cfg.rollout_min_reward, rollout_max_extra_steps=cfg.rollout_max_extra_steps,
        rollout_failed_calls_invalid=cfg.rollout_failed_calls_invalid,
        reference_segments=cfg.reference_segments,
        batch_trajectories=cfg.batch_trajectories, read_only=tuple(cfg.env.read_only), write=tuple(cfg.env.write),
    )
    return replace(settings, **overrides)


def drafting_environment(cfg: Any, trajectories: Sequence[Trajectory],
                         settings: DraftSettings) -> tuple[JobsFor, RestoreFor | None]:
    """How drafted lookups are answered at a cut point, per a mine config: from the recorded
    log (`env: replay`; no restore, so no rollouts) or by a live environment restored to the
    cut point (a fresh one per cut point)."""
    if cfg.env.name == "replay":
        from specagent.envs.replay import ReplayEnv

        replay = ReplayEnv(trajectories, read_only=cfg.env.read_only, write=cfg.env.write)
        return (lambda traj, cuts: replay_jobs(replay, traj, cuts, settings.max_draft_steps)), None
    from specagent.runtime.assembly import build_env

    def make_env() -> Environment:
        return build_env(cfg.env)

    def read_only_of(traj: Trajectory) -> dict[str, bool]:
        return classify_tools(traj.tools, cfg.env.read_only, cfg.env.write, strict=False)

    def jobs_for(traj: Trajectory, cuts: Sequence[int]) -> list[DraftJob]:
        return live_jobs(make_env, traj, cuts, settings.max_draft_steps, read_only_of(traj))

    def restore_for(traj: Trajectory, cut: int) -> Callable[[], Environment]:
        return lambda: restore(make_env, traj, cut, read_only_of(traj))

    return jobs_for, restore_for
