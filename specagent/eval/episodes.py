"""Run episodes over a task list and append them to `episodes.jsonl`, resumably.

Each line is one finished episode (format `specagent.episode/v1`); a rerun skips the
(task, mode, trial) triples already on disk, so a killed run continues where it stopped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tqdm import tqdm

from specagent.core.interfaces import Environment
from specagent.core.protocol import Episode, Models, ProtocolConfig, run_episode

EPISODE_FORMAT = "specagent.episode/v1"


def episode_record(ep: Episode, trial: int, models: dict[str, str]) -> dict[str, Any]:
    return {
        "format": EPISODE_FORMAT,
        "task_id": ep.task_id,
        "mode": ep.mode,
        "trial": trial,
        "models": models,
        "reward": ep.reward,
        "reward_info": ep.reward_info,
        "stop_reason": ep.stop_reason,
        "counts": ep.counts(),
        "accepted_prefixes": ep.accepted_prefixes,
        "verdicts": ep.verdicts,
        "ledger": ep.ledger.to_json(),
        "wall_seconds": ep.wall_seconds,
        "env_seconds": ep.env_seconds,
        "final_hash": ep.final_hash,
        "write_calls": ep.write_calls,
        "steps": [s.to_json() for s in ep.steps],
        "messages": [m.to_openai() for m in ep.messages],
    }


def episode_key(record: dict[str, Any]) -> tuple[str, str, int]:
    return (str(record["task_id"]), record["mode"], int(record.get("trial", 0)))


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """The finished episodes in a file. A torn last line (a killed write) is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # interrupted while writing: that episode reruns
                print(f"warning: {path}:{number}: dropping a torn last line", file=sys.stderr)
                break
            raise
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
) -> list[dict[str, Any]]:
    """Run every (trial, mode, task) not yet in ``out_path``; returns all records in the file."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    records = read_episodes(out_path)
    _rewrite_without_torn_tail(out_path, records)
    done = {episode_key(r) for r in records}
    todo = [(t, m, task) for t in range(trials) for m in modes for task in task_ids
            if (str(task), m, t) not in done]
    with out_path.open("a") as sink, tqdm(total=len(todo), desc="episodes", unit="ep", file=sys.stderr) as bar:
        for trial, mode, task in todo:
            ep = run_episode(env, str(task), mode, models, protocol)
            record = episode_record(ep, trial, model_names or {})
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            records.append(record)
            if on_episode is not None:
                on_episode(ep, record)
            bar.set_postfix(task=task, mode=mode, reward=ep.reward)
            bar.update()
    return records
