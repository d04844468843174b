"""Conversational rows (TRL's `messages` + `tools` format) built from trajectories: what the
drafter (and S) are trained on, and the HF dataset they are stored as.

Tool-call arguments are written in the template's canonical form (compact JSON, sorted
keys), so a row renders to the bytes the runtime serves (DESIGN §6).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from specagent.core.types import Message, Trajectory
from specagent.records.trajectories import read_trajectories


def canonical_arguments(arguments: dict[str, Any]) -> str:
    """Tool-call arguments as the chat template renders them (compact, sorted keys), so a
    JSON-string argument in a dataset renders to the same bytes as the runtime's dict."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def chat_json(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI chat dicts with one fixed key set (Arrow-friendly) and canonical arguments."""
    out = []
    for m in messages:
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": canonical_arguments(c.arguments)}}
            for c in m.tool_calls
        ]
        row: dict[str, Any] = {"role": m.role, "content": m.content}
        if calls:
            row["tool_calls"] = calls
        if m.tool_call_id is not None:
            row["tool_call_id"] = m.tool_call_id
        out.append(row)
    return out


def drafter_rows(trajectories: Sequence[Trajectory], split: dict[str, str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"train": [], "validation": []}
    for t in trajectories:
        out[split[t.task_id]].append({
            "messages": chat_json(t.messages),
            "tools": [spec.to_openai() for spec in t.tools],
            "trajectory_id": t.id,
            "task_id": t.task_id,
            "reward": t.reward,
        })
    return out


def to_dataset_dict(rows: dict[str, list[dict]], json_columns: Sequence[str]):
    from datasets import Dataset, DatasetDict, Features, Json, List, Value

    out = {}
    for name, split_rows in rows.items():
        if not split_rows:
            continue
        sample = split_rows[0]
        features = {}
        for key, value in sample.items():
            if key in json_columns:
                features[key] = List(Json())
            elif key in ("labels", "step_message_indices"):
                features[key] = List(Value("int64"))
            elif isinstance(value, bool):
                features[key] = Value("bool")
            elif isinstance(value, int):
                features[key] = Value("int64")
            elif isinstance(value, float) or value is None:
                features[key] = Value("float64")
            else:
                features[key] = Value("string")
        columns = {k: [r[k] for r in split_rows] for k in sample}
        out[name] = Dataset.from_dict(columns, features=Features(features))
    return DatasetDict(out)


def trajectory_rows(paths: str | list[str]) -> Any:
    """trajectories.jsonl file(s) as drafter rows (`messages`, `tools`, `reward`), in file order."""
    trajectories = [t for path in ([paths] if isinstance(paths, str) else paths) for t in read_trajectories(path)]
    rows = drafter_rows(trajectories, {t.task_id: "train" for t in trajectories})
    return to_dataset_dict(rows, ("messages", "tools"))["train"]
