"""The typed records stages write to and read from each other's files (DESIGN §2).

Each record is a pydantic model with a `format` version: writers build it, readers parse
it, so a file has one definition. A line that is not a valid record is an error that names
the file, the line and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from specagent.core.errors import TaskFileError
from specagent.core.files import read_text, split_lines

R = TypeVar("R", bound="Record")


class Record(BaseModel):
    """A record of a file format: unknown fields are errors; `dump` is its JSON object."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def parse(cls: type[R], raw: Any, where: str) -> R:
        """The record in ``raw`` (a decoded JSON object); ``where`` names it in errors ("file:line")."""
        try:
            return cls.model_validate(raw)
        except ValidationError as err:
            raise TaskFileError(f"{where}: not a valid {cls.__name__}: {field_problems(err)}") from None


def field_problems(err: ValidationError) -> str:
    """Every problem as ``field.path: message``, joined."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(the record)'}: {e['msg']}" for e in err.errors())


def jsonl_lines(path: str | Path, what: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line of a JSONL file."""
    for number, line in enumerate(split_lines(read_text(path, what)), 1):
        if line.strip():
            yield number, line


def read_jsonl(path: str | Path, record: type[R], what: str, torn_tail_ok: bool = False) -> list[R]:
    """Every line of a JSONL file as a ``record``. With ``torn_tail_ok`` a last line that is
    not JSON (a write killed half-way) is dropped with a warning, not an error."""
    path = Path(path)
    lines = list(jsonl_lines(path, what))
    out = []
    for index, (number, line) in enumerate(lines):
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            if torn_tail_ok and index == len(lines) - 1:
                import sys

                print(f"warning: {path}:{number}: dropping a torn last line", file=sys.stderr)
                break
            raise TaskFileError(f"{path}:{number}: not valid JSON ({exc.msg}, column {exc.colno})") from None
        out.append(record.parse(raw, f"{path}:{number}"))
    return out
