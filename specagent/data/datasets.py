"""Build the HF datasets and the dataset card from mined shard files.

Three `DatasetDict`s (train / validation, split by task: no task in both):
- `segments`: every drafted segment with its labels (the raw material);
- `drafter`: TRL conversational SFT examples (`messages`, `tools`), one per strong
  trajectory; the assistant turns (the strong model's) are the targets;
- `verdict`: the rendered verify prompt (`messages` + `tools`) with the index of each
  drafted step's message and its label (for a verdict head), and `prompt`/`completion`
  pairs whose completion is the concise verdict (for a generative verdict).

Nested chat data is stored with `datasets.Json` so that tool schemas and arguments
keep their exact shape (Arrow struct unification would add null fields).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from specagent.core.errors import ConfigError
from specagent.core.types import Trajectory
from specagent.core.verify import verify_messages
from specagent.data.mine import Shard
from specagent.engines.verdict_head import step_message_indices
from specagent.records.base import read_jsonl
from specagent.records.rows import chat_json, drafter_rows, to_dataset_dict
from specagent.records.segments import SegmentRecord, ShardRow, VerdictRow
from specagent.runtime.drafting import segment_stats


def split_of(task_id: str, validation_tasks: Sequence[str] | None, fraction: float) -> str:
    """Deterministic split by task: an explicit list, else a stable hash of the task id."""
    if validation_tasks is not None:
        return "validation" if str(task_id) in {str(t) for t in validation_tasks} else "train"
    bucket = int.from_bytes(hashlib.sha256(str(task_id).encode()).digest()[:4], "big") % 10_000
    return "validation" if bucket < fraction * 10_000 else "train"


def task_split(trajectories: Sequence[Trajectory], validation_tasks: Sequence[str] | None, fraction: float,
               split_by: str = "task") -> dict[str, str]:
    """task id -> train | validation, keeping groups whole: with ``split_by`` a key of the
    trajectories' meta (e.g. a user), every task of a group goes where the group goes (a
    listed validation task takes its group along). A listed task no trajectory has is an error."""
    tasks = {t.task_id for t in trajectories}
    unknown = sorted({str(v) for v in validation_tasks or ()} - tasks)
    if unknown:
        raise ConfigError(f"validation_tasks: {len(unknown)} id(s) match no trajectory: {', '.join(unknown[:5])} "
                          f"(the trajectories' tasks: {', '.join(sorted(tasks)[:5])}, ...)")
    group = {t.task_id: str(t.meta.get(split_by, t.task_id)) if split_by != "task" else t.task_id for t in trajectories}
    if validation_tasks is not None:
        listed = {group[str(v)] for v in validation_tasks}
        return {task: "validation" if group[task] in listed else "train" for task in tasks}
    return {task: split_of(group[task], None, fraction) for task in tasks}


def read_shards(work_dir: Path, trajectories: Sequence[Trajectory], shard_count: int) -> list[dict[str, Any]]:
    """All rows of all shards, in trajectory-file order; errors if a trajectory is missing."""
    rows: dict[str, dict[str, Any]] = {}
    for index in range(shard_count):
        path = work_dir / Shard(index, shard_count).filename
        if not path.exists():
            raise FileNotFoundError(f"{path}: shard {index}/{shard_count} has not been mined yet")
        for row in read_jsonl(path, ShardRow, "shard file"):
            rows[row.trajectory_id] = row.dump()
    missing = [t.id for t in trajectories if t.id not in rows]
    if missing:
        raise ValueError(f"{len(missing)} trajectories not mined yet (e.g. {missing[0]}); rerun the missing shard(s)")
    return [rows[t.id] for t in trajectories]


def verdict_rows(segments: Sequence[dict[str, Any]], by_id: dict[str, Trajectory], split: dict[str, str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"train": [], "validation": []}
    for seg in segments:
        traj = by_id[seg["trajectory_id"]]
        steps = SegmentRecord.parse(seg, f"segment {seg.get('id')}").drafted()
        verifiable = [s for s in steps if s.kind.value != "malformed"]
        if not verifiable:
            continue
        context = traj.messages[: seg["cut"]]
        messages = verify_messages(context, verifiable)
        indices = step_message_indices(len(context), verifiable)
        labels = seg["labels"][: len(verifiable)]
        out[split[traj.task_id]].append(VerdictRow(
            segment_id=seg["id"], task_id=traj.task_id, label_source=seg["label_source"],
            messages=chat_json(messages), tools=[spec.to_openai() for spec in traj.tools],
            step_message_indices=indices, labels=labels, prompt=chat_json(messages),
            completion=[{"role": "assistant", "content": str(sum(labels))}],
        ).dump())
    return out


def segment_rows(segments: Sequence[dict[str, Any]], split: dict[str, str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"train": [], "validation": []}
    for seg in segments:
        out[split[seg["task_id"]]].append({
            "id": seg["id"], "trajectory_id": seg["trajectory_id"], "task_id": seg["task_id"], "cut": seg["cut"],
            "steps": seg["steps"], "ended_by": seg["ended_by"], "labels": seg["labels"],
            "label_source": seg["label_source"], "reference": seg["reference"],
            "accepted": sum(seg["labels"]), "num_steps": len(seg["steps"]),
        })
    return out


def finalize(
    trajectories: Sequence[Trajectory],
    work_dir: Path,
    out_dir: Path,
    shard_count: int,
    validation_tasks: Sequence[str] | None,
    validation_fraction: float,
    config: dict[str, Any],
    versions: dict[str, Any],
    split_by: str = "task",
) -> dict[str, Any]:
    """Shard files -> `segments`, `drafter`, `verdict` datasets + `stats.json` + README card.
    The same shard contents always give the same datasets, however they were mined."""
    rows = read_shards(work_dir, trajectories, shard_count)
    everything = [seg for row in rows for seg in row["segments"]]
    segments = [seg for seg in everything if seg["label_source"] != "reference"]  # drafts only: acceptance
    split = task_split(trajectories, validation_tasks, validation_fraction, split_by)
    by_id = {t.id: t for t in trajectories}
    built = {
        "segments": to_dataset_dict(segment_rows(segments, split), ("steps", "reference")),
        "drafter": to_dataset_dict(drafter_rows(trajectories, split), ("messages", "tools")),
        "verdict": to_dataset_dict(verdict_rows(everything, by_id, split), ("messages", "tools", "prompt", "completion")),
    }
    for name, dataset in built.items():
        dataset.save_to_disk(str(out_dir / name))
    stats = {
        "trajectories": len(trajectories),
        "tasks": {s: sorted({t for t, v in split.items() if v == s}) for s in ("train", "validation")},
        "rows": {name: {k: len(v) for k, v in d.items()} for name, d in built.items()},
        "reference_segments": len(everything) - len(segments),
        "all": segment_stats(segments),
        "train": segment_stats([s for s in segments if split[s["task_id"]] == "train"]),
        "validation": segment_stats([s for s in segments if split[s["task_id"]] == "validation"]),
        "seconds_in_engines": sum(r["seconds_in_engines"] for r in rows),
        "wall_seconds": sum(r.get("wall_seconds", 0.0) for r in rows),
        "config": config,
        "versions": versions,
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    (out_dir / "README.md").write_text(dataset_card(stats))
    return stats


ENDED_BY = {
    "held": "the draft reached a state-changing call and held it for the verifier (DESIGN §1).",
    "malformed": "a drafted step failed to parse or to match a tool's schema; the draft ends before it.",
    "max_steps": "the draft reached `protocol.max_draft_steps`.",
    "unrecorded": "the drafter made a read-only call the log never recorded (replay mode); the draft ends there, "
                  "and that call counts as a drafted step that is not accepted. A live environment runs it instead.",
    "repeat": "the drafter repeated a read-only call made since the last user turn or state-changing call "
              "(`protocol.draft_stop_repeats`); the draft ends before it: its results are in the context already.",
    "context_length": "the context before the cut point, plus the draft so far, no longer fit the drafter's "
                      "`drafter.max_model_len`: no further step was drafted. Long runs reach it at their last cut "
                      "points. Raise `drafter.max_model_len`, or shorten every prompt with a compact prompt "
                      "profile (a tuned drafter carries its own; docs/train.md#prompt-profiles).",
    "end": "the reference segment reached the end of the strong trajectory.",
}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def dataset_card(stats: dict[str, Any]) -> str:
    a = stats["all"]
    engine, wall = stats["seconds_in_engines"], stats["wall_seconds"]
    lines = [
        "# specagent mined segments",
        "",
        f"Drafter `{stats['config'].get('drafter', {}).get('model', '?')}` on {stats['trajectories']} strong trajectories "
        f"(`{stats['config'].get('trajectories')}`), labeler `{stats['config'].get('labelers')}`, "
        f"environment `{stats['config'].get('env')}`.",
        "",
        "## Counts",
        "",
        "| split | tasks | segments | drafter rows | verdict rows | drafted steps | valid | acceptance | mean accepted prefix |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for split in ("train", "validation"):
        s = stats[split]
        lines.append(
            f"| {split} | {len(stats['tasks'][split])} | {s['segments']} | {stats['rows']['drafter'].get(split, 0)} | "
            f"{stats['rows']['verdict'].get(split, 0)} | {s['drafted_steps']} | {s['accepted_steps']} | "
            f"{_pct(s['acceptance_rate'])} | {s['mean_accepted_prefix'] or 0:.2f} |"
        )
    lines += ["", f"Label balance (all): {a['label_balance']['valid']} valid / {a['label_balance']['invalid']} invalid.", "",
              "## How drafts ended", "", "| ended by | segments |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in a["ended_by"].items()]
    lines += [""] + [f"- `{k}`: {ENDED_BY[k]}" for k in a["ended_by"] if k in ENDED_BY]
    lines += ["", "## Acceptance by step position", "", "| position | drafted | accepted | rate |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['drafted']} | {v['accepted']} | {_pct(v['rate'])} |" for k, v in a["by_position"].items()]
    lines += ["", "## Acceptance by tool (or step kind)", "", "| tool | drafted | accepted | rate |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['drafted']} | {v['accepted']} | {_pct(v['rate'])} |" for k, v in a["by_tool"].items()]
    lines += ["", "## Time", "",
              f"Wall time mining: {wall:.1f} s; inside the engines: {engine:.1f} s ({_pct(engine / wall if wall else None)}).",
              "", "## Config", "", "```json", json.dumps(stats["config"], indent=2), "```", "",
              "## Versions", "", "```json", json.dumps(stats["versions"], indent=2), "```", ""]
    return "\n".join(lines)
