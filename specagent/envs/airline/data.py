"""Loading the airline data the user points at: the database and a tau-bench runs file.

Nothing here is shipped: the database (``flights.json``, ``reservations.json``,
``users.json``) and the runs (a tau-bench result file: a JSON list of ``{task_id, trial,
reward, traj, info}``) come from the user's data directory. The runs give the tasks
(``info.task``: ``user_id``, ``instruction``, gold ``actions``, ``outputs``) and the policy
(the runs' system message). Grading compares databases by tau-bench's hash (``data_hash``).

The database is served as the runs saw it. tau-bench renamed the users' address field
``province`` to ``state`` (commit 404f33e, January 2025) after the shared GPT-4o runs were
recorded; when the runs' ``get_user_details`` results show ``province``, the field is
renamed back on load, so that replayed observations and gold hashes match the runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from specagent.core.errors import ConfigError
from specagent.core.files import read_text
from specagent.envs.airline.tools import Database

DB_FILES = ("flights", "reservations", "users")
TASK_KEYS = ("user_id", "instruction", "actions", "outputs")


@dataclass(frozen=True)
class AirlineData:
    """The seed database, the tasks by id ("0", "1", ... as `specagent import` numbers them) and the policy."""

    seed: bytes  # the database, pickled: unpickling is the fastest fresh copy
    tasks: dict[str, dict[str, Any]]
    policy: str
    runs: list[Any]  # the raw run records, for conformance checks
    known: dict[bytes, str]  # the hash texts of the seed's entries (see `data_hash`)
    rejected: dict[int, str] = field(default_factory=dict)  # lenient loading: unreadable runs by index, and why

    def fresh_db(self) -> Database:
        return pickle.loads(self.seed)

    def hash(self, db: Database) -> str:
        return data_hash(db, self.known)


def data_hash(db: Database, known: Mapping[bytes, str] | None = None) -> str:
    """tau-bench's ``gt_data_hash``: sha256 of ``str()`` of the database as nested tuples
    (dicts as ``(key, value)`` pairs sorted by key, lists as tuples).

    ``known`` maps pickled entries (one flight, reservation or user) to their text
    (``entry_texts``), so that only the entries an episode changed are rendered again."""
    sections = []
    for name in sorted(db):
        entries = [_entry_text(key, entry, known or {}) for key, entry in sorted(db[name].items())]
        sections.append(f"({name!r}, {_tuple_text(entries)})")
    return hashlib.sha256(_tuple_text(sections).encode("utf-8")).hexdigest()


def entry_texts(db: Database) -> dict[bytes, str]:
    """The ``known`` texts of ``data_hash`` for every entry of ``db``."""
    return {pickle.dumps(entry): str(_hashable(entry)) for section in db.values() for entry in section.values()}


def _entry_text(key: str, entry: Any, known: Mapping[bytes, str]) -> str:
    text = known.get(pickle.dumps(entry))  # equal pickles, equal objects: the cached text is exact
    return f"({key!r}, {text if text is not None else str(_hashable(entry))})"


def _tuple_text(items: list[str]) -> str:
    """``str()`` of a tuple whose items print as ``items``."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((key, _hashable(item)) for key, item in sorted(value.items()))
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    return value


def load_airline_data(data_dir: str | Path, runs: str | Path | None = None, *, strict: bool = True) -> AirlineData:
    """Read (once per process) the database in ``data_dir`` and the tasks and policy of
    ``runs`` (default: the one other ``*.json`` file in ``data_dir``). Problems raise
    ``ConfigError`` naming the path and the setting to fix.

    ``strict=False`` (for conformance checks) keeps going past runs that cannot be read:
    they are left out of the tasks and listed in ``rejected`` with the reason."""
    directory = Path(data_dir)
    if not directory.is_dir():
        raise ConfigError(f"env.airline.data_dir: {directory} is not a directory; point it at the tau-bench "
                          "airline data (flights.json, reservations.json, users.json)")
    missing = [f"{name}.json" for name in DB_FILES if not (directory / f"{name}.json").is_file()]
    if missing:
        raise ConfigError(f"env.airline.data_dir: {directory} lacks {', '.join(missing)} (the tau-bench airline "
                          "database: tau_bench/envs/airline/data/ of sierra-research/tau-bench)")
    runs_path = Path(runs) if runs is not None else _default_runs(directory)
    if not runs_path.is_file():
        raise ConfigError(f"env.airline.runs: {runs_path} is not a file; give a tau-bench runs file "
                          "(a JSON list of {task_id, trial, reward, traj, info})")
    return _load(str(directory.resolve()), str(runs_path.resolve()), strict)


def _default_runs(directory: Path) -> Path:
    candidates = sorted(p for p in directory.glob("*.json") if p.stem not in DB_FILES)
    if len(candidates) != 1:
        found = ", ".join(p.name for p in candidates) or "none"
        raise ConfigError(f"env.airline.runs: not set, and {directory} does not hold exactly one runs file "
                          f"(*.json besides the database; found: {found}); set env.airline.runs")
    return candidates[0]


@functools.lru_cache(maxsize=4)
def _load(directory: str, runs_path: str, strict: bool = True) -> AirlineData:
    db = {}
    for name in DB_FILES:
        path = Path(directory, f"{name}.json")
        try:
            db[name] = json.loads(read_text(path, "airline database file", ConfigError))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"env.airline.data_dir: {path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    try:
        runs = json.loads(read_text(runs_path, "airline runs file", ConfigError))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"env.airline.runs: {runs_path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    rejected: dict[int, str] = {}
    tasks, policy = _tasks_and_policy(runs, runs_path, None if strict else rejected)
    if _runs_show_province(runs):
        for user in db["users"].values():
            user["address"] = {("province" if key == "state" else key): v for key, v in user["address"].items()}
    seed = pickle.dumps(db, protocol=pickle.HIGHEST_PROTOCOL)
    # the hash texts are keyed by the pickles of a fresh copy: what `data_hash` sees in an episode
    return AirlineData(seed, tasks, policy, runs, entry_texts(pickle.loads(seed)), rejected)


def _runs_show_province(runs: list[dict[str, Any]]) -> bool:
    """Were the runs recorded on the database before tau-bench renamed ``province`` to ``state``?"""
    return any(
        isinstance(m, dict) and m.get("role") == "tool" and m.get("name") == "get_user_details"
        and '"province": ' in str(m.get("content") or "")
        for run in runs if isinstance(run, dict) and isinstance(run.get("traj"), list) for m in run["traj"]
    )


def _task_problem(run: Any) -> str | None:
    """Why ``run`` gives no usable task and policy, or None."""
    if not isinstance(run, dict):
        return f"is not a JSON object but {type(run).__name__}"
    lacking = [key for key in ("task_id", "traj", "info") if key not in run]
    if lacking:
        return f"lacks {', '.join(lacking)}"
    if not isinstance(run["traj"], list) or not isinstance(run["info"], dict):
        return "has a traj that is not a list or an info that is not an object"
    task = run["info"].get("task")
    if not isinstance(task, dict):
        return "lacks info.task"
    missing = [key for key in TASK_KEYS if key not in task]
    if missing:
        return f"info.task lacks {', '.join(missing)}"
    actions = task["actions"]
    if not isinstance(actions, list) or not all(
        isinstance(a, dict) and isinstance(a.get("name"), str) and isinstance(a.get("kwargs"), dict) for a in actions
    ):
        return "info.task.actions is not a list of {name, kwargs} objects"
    if not isinstance(task["outputs"], list) or not all(isinstance(o, str) for o in task["outputs"]):
        return "info.task.outputs is not a list of strings"
    if not isinstance(task["instruction"], str):
        return "info.task.instruction is not a string"
    if not any(isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), str)
               for m in run["traj"]):
        return "has no system message in traj"
    return None


def _tasks_and_policy(
    runs: Any, where: str, rejected: dict[int, str] | None = None
) -> tuple[dict[str, dict[str, Any]], str]:
    """The runs' tasks (one per task id; trials of a task must agree) and their system message.

    With ``rejected`` (lenient), a run that cannot be read or disagrees with an earlier one
    is recorded there by index instead of failing the whole file."""
    if not isinstance(runs, list) or not runs:
        raise ConfigError(f"env.airline.runs: {where} must be a non-empty JSON list of tau-bench runs")
    tasks: dict[str, dict[str, Any]] = {}
    policy: str | None = None

    def refuse(number: int, problem: str) -> None:
        if rejected is None:
            raise ConfigError(f"env.airline.runs: {where}: run [{number}] {problem}")
        rejected[number] = problem

    for number, run in enumerate(runs):
        problem = _task_problem(run)
        if problem is not None:
            refuse(number, problem)
            continue
        task_id, task = str(run["task_id"]), run["info"]["task"]
        system = next(m["content"] for m in run["traj"] if isinstance(m, dict) and m.get("role") == "system")
        if policy is not None and system != policy:
            refuse(number, "has another system message than the runs before it (the policy must be one)")
            continue
        if tasks.setdefault(task_id, task) != task:
            refuse(number, f"gives task {task_id} another info.task")
            continue
        policy = system
    if policy is None:
        raise ConfigError(f"env.airline.runs: {where}: no run can be read ({len(runs)} runs; e.g. run [0] "
                          f"{(rejected or {}).get(0, 'is unreadable')})")
    ordered = sorted(tasks, key=lambda t: (len(t), t))  # "2" before "10"
    return {task_id: tasks[task_id] for task_id in ordered}, policy
