"""MCP tasks from a strong model's successful runs: `specagent env tasks-from-runs`.

A user's logs are the cheapest gold they have. Each kept run becomes one task of the
`McpEnv` format: its system message is ``system``, its first user message is ``request``,
the user's later messages are ``followups`` (replayed in order, whatever the agent says:
a scripted user, not a simulated one), and the state-changing calls that succeeded in the
run, in order, are ``gold_actions``. So the reward asks an agent to make exactly the
writes the strong model made in a run that succeeded. A call counts as a write when the
run's tools say it is not read-only (unknown = write, DESIGN §1); it succeeded when its
observation does not start with "Error".
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import yaml

from specagent.core.classify import changed_state
from specagent.core.errors import ConfigError
from specagent.core.types import Trajectory


@dataclass
class RunTasks:
    """The tasks made from a set of runs, and how many runs each rule left out."""

    tasks: list[dict[str, Any]] = field(default_factory=list)
    left_out: Counter = field(default_factory=Counter)


def gold_writes(traj: Trajectory) -> list[dict[str, Any]]:
    """The state-changing calls of the run that succeeded, in order, as ``{name, arguments}``."""
    read_only = {tool.name: tool.read_only for tool in traj.tools}
    observations = {m.tool_call_id: m.content or "" for m in traj.messages if m.role == "tool"}
    return [
        {"name": call.name, "arguments": call.arguments}
        for message in traj.messages if message.role == "assistant"
        for call in message.tool_calls
        if changed_state(read_only.get(call.name), observations.get(call.id, ""))
    ]


def task_from_run(traj: Trajectory) -> dict[str, Any] | None:
    """One MCP task from one run, or None when the run has no user message."""
    users = [m.content or "" for m in traj.messages if m.role == "user"]
    if not users:
        return None
    task: dict[str, Any] = {"id": traj.id, "request": users[0]}
    system = next((m.content for m in traj.messages if m.role == "system" and m.content), None)
    if system:
        task["system"] = system
    if users[1:]:
        task["followups"] = users[1:]
    task["gold_actions"] = gold_writes(traj)
    task["meta"] = {"task_id": traj.task_id, "reward": traj.reward, "source": traj.source, "model": traj.model}
    return task


def tasks_from_runs(trajectories: Sequence[Trajectory], task_ids: Sequence[str] | None = None,
                    min_reward: float | None = 1.0) -> RunTasks:
    """Tasks from the runs of ``task_ids`` (all when None) whose reward is at least
    ``min_reward`` where a reward was recorded (None: every run)."""
    wanted = None if task_ids is None else {str(t) for t in task_ids}
    unknown = sorted((wanted or set()) - {traj.task_id for traj in trajectories})
    if unknown:
        raise ConfigError(f"--task-ids: no run of task {', '.join(unknown)} in the trajectories")
    out = RunTasks()
    for traj in trajectories:
        if wanted is not None and traj.task_id not in wanted:
            out.left_out["not in --task-ids"] += 1
        elif min_reward is not None and traj.reward is not None and traj.reward < min_reward:
            out.left_out[f"reward below {min_reward:g}"] += 1
        elif (task := task_from_run(traj)) is None:
            out.left_out["no user message"] += 1
        else:
            out.tasks.append(task)
    return out


def tasks_text(tasks: Sequence[dict[str, Any]], jsonl: bool = False) -> str:
    """``tasks`` as a task file `load_tasks` reads: JSONL, or YAML with multi-line strings as
    readable `|` blocks."""
    if jsonl:
        return "".join(json.dumps(task, ensure_ascii=False) + "\n" for task in tasks)
    return yaml.dump(list(tasks), Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (a policy, a long request) as readable `|` blocks."""


_BlockDumper.add_representer(
    str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                                       style="|" if "\n" in value else None))
