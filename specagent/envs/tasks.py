"""Reading task files: one JSON object per line, each problem reported as ``file:line: problem``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from specagent.core.errors import TaskFileError
from specagent.core.files import read_text, split_lines

TaskCheck = Callable[[dict[str, Any]], str | None]


def _parse_line(text: str, required_keys: Sequence[str], check: TaskCheck | None) -> dict[str, Any]:
    """One task from one line; raises ValueError with the problem in words."""
    try:
        task = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(task, dict):
        raise ValueError(f"expected a JSON object, got {type(task).__name__}")
    missing = [key for key in required_keys if key not in task]
    if missing:
        raise ValueError(f"missing required key(s) {', '.join(missing)}")
    problem = check(task) if check is not None else None
    if problem:
        raise ValueError(problem)
    return task


def load_jsonl_tasks(
    path: str | Path,
    required_keys: Sequence[str] = ("id",),
    check: TaskCheck | None = None,
) -> list[dict[str, Any]]:
    """Load tasks from a JSONL file; blank lines are skipped, ids must be unique.

    ``check`` may return a problem string for a task that parses but is invalid for
    the environment reading it. Every problem raises ``TaskFileError`` with the
    message ``"{path}:{lineno}: {problem}"``.
    """
    lines = split_lines(read_text(path, "task file"))
    tasks: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            task = _parse_line(text, required_keys, check)
        except ValueError as exc:
            raise TaskFileError(f"{path}:{lineno}: {exc}") from None
        task_id = str(task.get("id", lineno))
        if task_id in seen:
            raise TaskFileError(f"{path}:{lineno}: duplicate task id {task_id!r} (first on line {seen[task_id]})")
        seen[task_id] = lineno
        tasks.append(task)
    return tasks
