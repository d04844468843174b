"""The trajectory artifact on disk: ``trajectories.jsonl``, one ``specagent.trajectory/v1``
object per line (DESIGN §2).

Writes are atomic: the lines go to a temporary file next to the target, which is renamed
over it only once everything is written, so a failed run never leaves a half file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from specagent.core.errors import TaskFileError
from specagent.core.files import read_text, split_lines
from specagent.core.types import Trajectory

TRAJECTORY_FORMAT = "specagent.trajectory/v1"


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """Write ``trajectories`` to ``path`` atomically; returns how many were written."""
    lines = [json.dumps(t.to_json(), ensure_ascii=False) for t in trajectories]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file in the target's folder, then rename it into place."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; the file is a plain output
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a ``trajectories.jsonl`` file. Every problem raises ``TaskFileError("file:line: ...")``.

    Blank lines are skipped; trajectory ids must be unique within the file.
    """
    lines = split_lines(read_text(path, "trajectory file"))
    out: list[Trajectory] = []
    first_line: dict[str, int] = {}
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            trajectory = _parse_line(text)
        except ValueError as exc:
            raise TaskFileError(f"{path}:{lineno}: {exc}") from None
        if trajectory.id in first_line:
            first = first_line[trajectory.id]
            raise TaskFileError(f"{path}:{lineno}: duplicate trajectory id {trajectory.id!r} (first on line {first})")
        first_line[trajectory.id] = lineno
        out.append(trajectory)
    return out


def _parse_line(text: str) -> Trajectory:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    tag = raw.get("format")
    if tag != TRAJECTORY_FORMAT:
        hint = " (convert logs with `specagent import`)" if tag is None else ""
        raise ValueError(f"format is {tag!r}, expected {TRAJECTORY_FORMAT!r}{hint}")
    problem = _shape_problem(raw)
    if problem:
        raise ValueError(problem)
    try:
        return Trajectory.from_json(raw)
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed trajectory: {type(exc).__name__}: {exc}") from None


def _shape_problem(raw: dict[str, Any]) -> str | None:
    """The first structural problem of a v1 record, or None (the writer's own output never has one)."""
    for key in ("id", "task_id", "messages"):
        if key not in raw:
            return f"missing required key {key!r}"
    if not isinstance(raw["messages"], list):
        return "messages: expected a list"
    for index, message in enumerate(raw["messages"]):
        if not isinstance(message, dict) or "role" not in message:
            return f"messages[{index}]: expected an object with a 'role'"
    if not isinstance(raw.get("tools", []), list):
        return "tools: expected a list"
    for index, tool in enumerate(raw.get("tools", [])):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return f"tools[{index}]: expected an OpenAI function spec with a name"
    return None
