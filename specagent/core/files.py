"""The files a user points specagent at: read them, and check where outputs go, with one
error per problem that names the file (and the line), never a traceback.

Every config, task, trajectory, episodes and import file is read with ``read_text``: a
missing file, a directory, an unreadable file and bytes that are not UTF-8 all become the
caller's error class (``ConfigError`` or ``TaskFileError``, both exit code 2 at the CLI).
"""

from __future__ import annotations

from pathlib import Path

from specagent.core.errors import ConfigError, SpecAgentError, TaskFileError

__all__ = ["check_output_dir", "check_output_file", "read_text", "split_lines", "utf8_problem"]


def read_text(path: str | Path, what: str, error: type[SpecAgentError] = TaskFileError) -> str:
    """The UTF-8 text of ``path``. ``what`` names the file in messages ("config file", "task
    file", ...); every way the file cannot be read raises ``error``:
    ``"{path}: cannot read {what}: ..."``, or ``"{path}:{line}: ..."`` for a byte that is not UTF-8."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: cannot read {what}: not found") from None
    except IsADirectoryError:
        raise error(f"{path}: cannot read {what}: it is a directory") from None
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    problem = utf8_problem(data)
    if problem is not None:
        line, text = problem
        raise error(f"{path}:{line}: cannot read {what}: {text}")
    return data.decode("utf-8")


def split_lines(text: str) -> list[str]:
    """The lines of a JSONL file, numbered as an editor numbers them: split at "\\n" only (a "\\r"
    before it dropped). ``str.splitlines`` also splits at U+2028, U+0085 and others, which a JSON
    string may hold unescaped (``json.dumps(..., ensure_ascii=False)`` writes them as they are)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def utf8_problem(data: bytes) -> tuple[int, str] | None:
    """(line number, description) of the first byte of ``data`` that is not UTF-8, or None."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return line, f"not UTF-8 text ({exc.reason}: byte 0x{data[exc.start]:02x} at column {column})"
    return None


def check_output_file(path: str | Path, what: str, error: type[SpecAgentError] = ConfigError) -> Path:
    """``path`` as a file to write: not an existing directory, and no file where its folder goes."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: the {what} is a directory; give a file path")
    _check_parents(path.parent, what, error)
    return path


def check_output_dir(path: str | Path, what: str, error: type[SpecAgentError] = ConfigError) -> Path:
    """``path`` as a directory to write into: not an existing file, nor below one."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise error(f"{path}: the {what} is a file, not a directory")
    _check_parents(path.parent, what, error)
    return path


def _check_parents(folder: Path, what: str, error: type[SpecAgentError]) -> None:
    for parent in (folder, *folder.parents):
        if parent.exists():
            if not parent.is_dir():
                raise error(f"{parent}: a file is where the {what}'s folder should be")
            return
