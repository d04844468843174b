"""Importing agent logs from elsewhere into ``trajectories.jsonl`` (DESIGN §2).

Three input formats, sniffed with ``fmt="auto"``:

- ``openai``: OpenAI chat records, one per JSONL line (or a JSON list of them):
  ``{"messages": [...], "tools": [...]?, "id"?, "task_id"?, "reward"?, "model"?, "meta"?}``.
  Other top-level keys are kept in ``meta``. Our own ``specagent.trajectory/v1`` files
  are valid input too.
- ``tau``: tau-bench result files: a JSON list of ``{task_id, trial, reward, traj, info}``
  with ``traj`` in OpenAI format; ``info.task`` and ``info.reward_info`` go to ``meta``.
  Runs that crashed (empty ``traj`` and an ``info.error``) are skipped with a warning.
- ``tau2``: tau2-bench results: ``{"info": ..., "tasks": [...], "simulations": [...]}``.
  Each simulation's ``messages`` use tau2's own shape: tool calls are
  ``{id, name, arguments: {...}, requestor}`` and tool messages carry ``id`` (not
  ``tool_call_id``). The agent's policy (``info.environment_info.policy``) becomes the
  system message, ``info.environment_info.tool_defs`` (when saved) the tool schemas and
  ``reward_info.reward`` the reward. Tool calls the *user simulator* made (``requestor:
  "user"``, telecom's dual control) are not part of the agent's conversation: they are
  dropped, and counted in ``meta["dropped_user_tool_calls"]``.

Output is normalised: tool-call arguments are decoded dicts, every assistant tool call is
answered by a tool message with its id (right after it), tool messages carry the tool's
name, and a call id names one call per run (a reused id is renamed ``{id}_2``, ...).
Trajectory ids are deterministic: ``{source}:{task_id}:{trial}`` for tau/tau2 runs, the
record's own ``id`` or ``{source}:{line}`` (``{source}:{index}`` in a JSON list) for chat
records; ``source`` defaults to the input file's stem.

Every problem names the file, the record and the field, e.g.
``runs.json: record [3] (task_id 7, trial 1): traj[3].tool_calls[0].function.arguments:
not valid JSON (...)``. All inputs are checked before anything is written, and the output
is written atomically, so a failed import leaves no file behind.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import jsonschema

from specagent.core.errors import TaskFileError
from specagent.core.files import check_output_file, read_text, split_lines
from specagent.core.types import Message, ToolCall, ToolSpec, Trajectory, union_tools
from specagent.data.schemas import ToolsOverride, apply_override, infer_tool_specs, load_tools_file
from specagent.records.trajectories import write_trajectories

Format = Literal["auto", "openai", "tau", "tau2"]
FORMATS: tuple[str, ...] = ("auto", "openai", "tau", "tau2")
ROLES = ("system", "user", "assistant", "tool")
MAX_SHOWN_PROBLEMS = 20


class TrajectoryImportError(TaskFileError):
    """Input logs with problems. ``problems`` lists each as ``"file: record: field: what"``."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        shown = self.problems[:MAX_SHOWN_PROBLEMS]
        more = len(self.problems) - len(shown)
        text = "\n".join(shown) + (f"\n... and {more} more problem(s)" if more > 0 else "")
        if len(self.problems) > 1:
            text = f"{len(self.problems)} problem(s) in the input, nothing was written:\n{text}"
        super().__init__(text)


class _Problem(Exception):
    """Internal: one problem inside a record, at ``field`` (a dotted path like ``traj[3].content``)."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(message)
        self.field = field_path
        self.message = message


@dataclass
class ImportReport:
    """What an import read and wrote; ``summary()`` is the CLI's text."""

    out: str
    files: list[tuple[str, str, int]]  # (path, format, trajectories)
    trajectories: int
    messages: int
    tool_calls: int
    tools: list[ToolSpec]  # every tool of the written trajectories, first spec per name
    inferred: list[str]  # tools whose schema was inferred from the calls
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rewards: dict[str, int] = field(default_factory=dict)  # reward -> runs ("unknown": none recorded)

    def summary(self) -> str:
        lines = [
            f"imported {self.trajectories} trajectories ({self.messages} messages, {self.tool_calls} tool calls)"
            f" from {len(self.files)} file(s) -> {self.out}"
        ]
        lines += [f"  {path}: {fmt}, {count} trajectories" for path, fmt, count in self.files]
        if self.rewards:
            lines.append("rewards: " + ", ".join(f"{k}: {v}" for k, v in self.rewards.items())
                         + " (train drafter keeps reward >= min_reward, 1.0 by default, and unknown ones)")
        flags = {True: "read-only", False: "write", None: "unclassified: treated as write"}
        lines.append(f"tools ({len(self.tools)}):")
        lines += [
            f"  {t.name} [{flags[t.read_only]}]{' (inferred schema)' if t.name in self.inferred else ''}"
            for t in self.tools
        ]
        lines += [f"skipped: {s}" for s in self.skipped]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


@dataclass
class _Parsed:
    """One converted record, before tool schemas are settled."""

    label: str
    trajectory: Trajectory
    declared_tools: list[ToolSpec] | None  # the record's own schemas, None if it has none


@dataclass(frozen=True)
class _Context:
    path: Path
    source: str | None  # the caller's; None: the record's own (chat records) or the file's stem
    model: str | None

    @property
    def default_source(self) -> str:
        return self.source or self.path.stem


# ---------------------------------------------------------------- entry points


def import_trajectories(
    inputs: Sequence[str | Path],
    fmt: Format = "auto",
    out: str | Path = "trajectories.jsonl",
    tools_yaml: str | Path | None = None,
    source: str | None = None,
    model: str | None = None,
) -> ImportReport:
    """Convert ``inputs`` to ``out`` (``specagent.trajectory/v1`` JSONL), all or nothing.

    Raises ``TrajectoryImportError`` (a ``TaskFileError``) listing every problem found in
    the inputs, or ``ConfigError`` for a bad tools file; in both cases ``out`` is untouched.
    """
    out_path = check_output_file(out, "output (-o)", TaskFileError)
    if any(Path(p).resolve() == out_path.resolve() for p in inputs):
        raise TrajectoryImportError([f"{out}: the output file is also an input; choose another output path"])
    trajectories, report = convert_files(inputs, fmt, tools_yaml, source, model)
    try:
        write_trajectories(out_path, trajectories)
    except OSError as exc:  # atomic: nothing is left behind
        raise TrajectoryImportError([f"{out}: cannot write the output: {exc.strerror or exc}"]) from None
    report.out = str(out_path)
    return report


def convert_files(
    inputs: Sequence[str | Path],
    fmt: Format = "auto",
    tools_yaml: str | Path | None = None,
    source: str | None = None,
    model: str | None = None,
) -> tuple[list[Trajectory], ImportReport]:
    """Read and validate every input, settle the tool schemas; writes nothing."""
    if fmt not in FORMATS:
        raise TrajectoryImportError([f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}"])
    if not inputs:
        raise TrajectoryImportError(["no input files given"])
    override = load_tools_file(tools_yaml) if tools_yaml is not None else None
    problems: list[str] = []
    parsed: list[_Parsed] = []
    files: list[tuple[str, str, int]] = []
    skipped: list[str] = []
    for path in map(Path, inputs):
        context = _Context(path=path, source=source, model=model)
        found, file_format = _convert_file(context, fmt, problems, skipped)
        parsed += found
        files.append((str(path), file_format, len(found)))
    problems += _duplicate_ids(parsed)
    if problems:
        raise TrajectoryImportError(problems)
    if not parsed:
        raise TrajectoryImportError([f"{', '.join(map(str, inputs))}: no trajectories found"])
    inferred, warnings = _settle_tools(parsed, override)
    trajectories = [p.trajectory for p in parsed]
    report = ImportReport(
        out="",
        files=files,
        trajectories=len(trajectories),
        messages=sum(len(t.messages) for t in trajectories),
        tool_calls=sum(len(m.tool_calls) for t in trajectories for m in t.messages),
        tools=union_tools(trajectories),
        inferred=inferred,
        skipped=skipped,
        warnings=warnings,
        rewards=reward_counts(trajectories),
    )
    return trajectories, report


def reward_counts(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """How many runs have each reward, highest first; runs with none as `unknown`."""
    counts = Counter("unknown" if t.reward is None else f"{t.reward:g}" for t in trajectories)
    return dict(sorted(counts.items(), key=lambda kv: (kv[0] == "unknown", -float(kv[0]) if kv[0] != "unknown" else 0)))


# ---------------------------------------------------------------- files and format sniffing


def _convert_file(context: _Context, fmt: str, problems: list[str], skipped: list[str]) -> tuple[list[_Parsed], str]:
    """Every record of one file, converted; problems are appended, never raised."""
    try:
        kind, payload = _load(context.path)
        file_format = _sniff(kind, payload) if fmt == "auto" else fmt
        records = _records(context.path, kind, payload, file_format)
        shared = _tau2_shared(payload) if file_format == "tau2" else None
    except TaskFileError as unreadable:
        problems.append(str(unreadable))
        return [], fmt
    except _Problem as problem:
        problems.append(_where(str(context.path), problem))
        return [], fmt
    convert = _CONVERTERS[file_format]
    found = []
    for label, number, raw in records:
        label = _label(label, raw)
        try:
            if isinstance(raw, _Problem):
                raise raw
            if file_format == "tau" and _crashed_tau_run(raw):
                skipped.append(f"{label}: the run crashed ({str(raw['info']['error'])[:120]})")
                continue
            trajectory, declared = convert(raw, context, number, shared)
        except _Problem as problem:
            problems.append(_where(label, problem))
            continue
        found.append(_Parsed(label=label, trajectory=trajectory, declared_tools=declared))
    return found, file_format


def _load(path: Path) -> tuple[str, Any]:
    """("json", document) or ("jsonl", [(line number, text)])."""
    text = read_text(path, "input file")  # a TaskFileError naming the file (and line)
    lines = [(n, line) for n, line in enumerate(split_lines(text), start=1) if line.strip()]
    if not lines:
        raise _Problem("", "the file is empty")
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl", lines
    try:
        document = _strict_loads(text)
    except json.JSONDecodeError as whole:
        if text.lstrip().startswith("[") or not _parses(lines[0][1]):
            raise _Problem("", f"not valid JSON at line {whole.lineno}, column {whole.colno}: {whole.msg}") from None
        return "jsonl", lines
    if len(lines) == 1 and isinstance(document, dict) and "simulations" not in document:
        return "jsonl", lines  # one record on one line: name it by its line
    return "json", document


def _sniff(kind: str, payload: Any) -> str:
    if kind == "json" and isinstance(payload, dict) and "simulations" in payload:
        return "tau2"
    if kind == "jsonl":
        first = _first_parsed_line(payload)
    elif isinstance(payload, list):
        first = payload[0] if payload else None
    else:
        first = payload
    if isinstance(first, dict) and "traj" in first:
        return "tau"
    if isinstance(first, dict) and "messages" in first:
        return "openai"
    raise _Problem(
        "",
        "cannot tell the format: expected OpenAI chat records (`messages`), tau-bench runs (`traj`)"
        " or tau2-bench results (`simulations`); pass the format explicitly",
    )


def _records(path: Path, kind: str, payload: Any, file_format: str) -> list[tuple[str, int, Any]]:
    """(label, position, raw record) for each record of the file. The position is the line
    number in JSONL and the index in a JSON list; an unparseable line's record is its _Problem."""
    if file_format == "tau2":
        if kind != "json" or not isinstance(payload, dict) or not isinstance(payload.get("simulations"), list):
            raise _Problem("simulations", "expected a tau2-bench results object with a `simulations` list")
        return [(f"{path}: simulations[{i}]", i, raw) for i, raw in enumerate(payload["simulations"])]
    if kind == "jsonl":
        return [(f"{path}:{lineno}", lineno, _parse_line(text)) for lineno, text in payload]
    if isinstance(payload, list):
        return [(f"{path}: record [{i}]", i, raw) for i, raw in enumerate(payload)]
    if isinstance(payload, dict):
        return [(f"{path}: record", 0, payload)]
    raise _Problem("", f"expected JSON objects, got a {type(payload).__name__}")


def _parse_line(text: str) -> Any:
    try:
        return _strict_loads(text)
    except json.JSONDecodeError as exc:
        return _Problem("", f"not valid JSON: {exc.msg} (column {exc.colno})")


def _strict_loads(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, which no other JSON reader accepts."""
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def _parses(text: str) -> bool:
    try:
        _strict_loads(text)
        return True
    except json.JSONDecodeError:
        return False


def _first_parsed_line(lines: list[tuple[int, str]]) -> Any:
    for _, text in lines:
        value = _parse_line(text)
        if not isinstance(value, _Problem):
            return value
    return None


def _label(label: str, raw: Any) -> str:
    """The record's location, plus its task and trial when it has them."""
    if not isinstance(raw, dict) or "task_id" not in raw:
        return label
    trial = f", trial {raw['trial']}" if raw.get("trial") is not None else ""
    return f"{label} (task_id {raw['task_id']}{trial})"


def _where(label: str, problem: _Problem) -> str:
    return f"{label}: {problem.field}: {problem.message}" if problem.field else f"{label}: {problem.message}"


# ---------------------------------------------------------------- OpenAI chat records


_OPENAI_KEYS = ("messages", "tools", "id", "task_id", "reward", "model", "meta", "source", "format")


def _from_openai(raw: Any, context: _Context, position: int, _: Any) -> tuple[Trajectory, list[ToolSpec] | None]:
    record = _object(raw, "")
    if "messages" not in record:
        raise _Problem("messages", "missing: an OpenAI chat record needs a `messages` list")
    messages, renamed = _link(_openai_messages(record["messages"], "messages"))
    tools = _openai_tools(record["tools"], "tools") if record.get("tools") else None
    source = context.source or str(record.get("source") or context.default_source)
    traj_id = str(record["id"]) if record.get("id") is not None else f"{source}:{position}"
    meta = dict(_object(record.get("meta") or {}, "meta"))
    meta.update({k: v for k, v in record.items() if k not in _OPENAI_KEYS})
    meta.update({"renamed_tool_call_ids": renamed} if renamed else {})
    trajectory = Trajectory(
        id=traj_id,
        task_id=str(record["task_id"]) if record.get("task_id") is not None else traj_id,
        tools=[],
        messages=messages,
        reward=_reward(record.get("reward"), "reward"),
        source=source,
        model=context.model or str(record.get("model") or ""),
        meta=meta,
    )
    return trajectory, tools


def _openai_messages(raw: Any, where: str) -> list[tuple[str, Message]]:
    items = _list(raw, where)
    if not items:
        raise _Problem(where, "empty: a trajectory needs at least one message")
    return [(f"{where}[{i}]", _openai_message(m, f"{where}[{i}]")) for i, m in enumerate(items)]


def _openai_message(raw: Any, where: str) -> Message:
    message = _object(raw, where)
    role = message.get("role")
    if role not in ROLES:
        raise _Problem(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
    if message.get("function_call"):
        raise _Problem(f"{where}.function_call", "legacy `function_call` is not supported: convert it to `tool_calls`")
    calls: tuple[ToolCall, ...] = ()
    raw_calls = message.get("tool_calls") or []
    if role == "assistant":
        calls = tuple(
            _openai_tool_call(c, f"{where}.tool_calls[{j}]")
            for j, c in enumerate(_list(raw_calls, f"{where}.tool_calls"))
        )
    elif raw_calls:
        raise _Problem(f"{where}.tool_calls", f"only assistant messages call tools, this one is {role!r}")
    tool_call_id = None
    if role == "tool":
        tool_call_id = message.get("tool_call_id")
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise _Problem(f"{where}.tool_call_id", "missing: a tool message must give the id of the call it answers")
    name = message.get("name")
    return Message(
        role=role,
        content=_content(message.get("content"), f"{where}.content", role),
        tool_calls=calls,
        tool_call_id=tool_call_id,
        name=name if isinstance(name, str) else None,
    )


def _openai_tool_call(raw: Any, where: str) -> ToolCall:
    call = _object(raw, where)
    if call.get("type", "function") != "function":
        raise _Problem(f"{where}.type", f"expected 'function', got {call.get('type')!r}")
    function = _object(call.get("function"), f"{where}.function")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise _Problem(f"{where}.id", "missing: every tool call needs an id that its tool message repeats")
    return ToolCall(
        id=call_id,
        name=_tool_name(function.get("name"), f"{where}.function.name"),
        arguments=_arguments(function.get("arguments"), f"{where}.function.arguments"),
    )


def _openai_tools(raw: Any, where: str) -> list[ToolSpec]:
    specs = []
    for i, entry in enumerate(_list(raw, where)):
        entry = _object(entry, f"{where}[{i}]")
        function = _object(entry.get("function", entry), f"{where}[{i}].function")
        name = _tool_name(function.get("name"), f"{where}[{i}].function.name")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        _check_schema(parameters, f"{where}[{i}].function.parameters")
        read_only = entry.get("read_only")
        specs.append(
            ToolSpec(
                name=name,
                description=str(function.get("description") or ""),
                parameters=parameters,
                read_only=read_only if isinstance(read_only, bool) else None,
            )
        )
    return specs


# ---------------------------------------------------------------- tau-bench result files


def _from_tau(raw: Any, context: _Context, position: int, _: Any) -> tuple[Trajectory, None]:
    record = _object(raw, "")
    for key in ("task_id", "traj"):
        if key not in record:
            raise _Problem(key, "missing: a tau-bench run needs `task_id` and `traj`")
    trial = record.get("trial") if record.get("trial") is not None else position
    info = _object(record.get("info") or {}, "info")
    meta: dict[str, Any] = {"trial": trial}
    meta.update({key: info[key] for key in ("task", "reward_info") if key in info})
    messages, renamed = _link(_openai_messages(record["traj"], "traj"))
    meta.update({"renamed_tool_call_ids": renamed} if renamed else {})
    trajectory = Trajectory(
        id=f"{context.default_source}:{record['task_id']}:{trial}",
        task_id=str(record["task_id"]),
        tools=[],
        messages=messages,
        reward=_reward(record.get("reward"), "reward"),
        source=context.default_source,
        model=context.model or "",
        meta=meta,
    )
    return trajectory, None


def _crashed_tau_run(raw: Any) -> bool:
    """tau-bench saves a run that raised as an empty `traj` with `info.error`."""
    return (
        isinstance(raw, dict)
        and raw.get("traj") == []
        and isinstance(raw.get("info"), dict)
        and "error" in raw["info"]
    )


# ---------------------------------------------------------------- tau2-bench results


@dataclass(frozen=True)
class _Tau2Shared:
    """What every simulation of a tau2 results file shares."""

    policy: str | None
    tools: list[ToolSpec] | None
    agent_llm: str | None
    tasks: dict[str, Any]


def _tau2_shared(payload: dict[str, Any]) -> _Tau2Shared:
    info = payload.get("info") if isinstance(payload.get("info"), dict) else {}
    env_info = info.get("environment_info") if isinstance(info.get("environment_info"), dict) else {}
    agent_info = info.get("agent_info") if isinstance(info.get("agent_info"), dict) else {}
    tasks = {str(t["id"]): t for t in payload.get("tasks") or [] if isinstance(t, dict) and "id" in t}
    policy = env_info.get("policy")
    return _Tau2Shared(
        policy=policy if isinstance(policy, str) and policy.strip() else None,
        tools=_tau2_tool_defs(env_info.get("tool_defs")),
        agent_llm=agent_info.get("llm") if isinstance(agent_info.get("llm"), str) else None,
        tasks=tasks,
    )


def _tau2_tool_defs(raw: Any) -> list[ToolSpec] | None:
    """tau2 saves ``{name: {name, doc, params, returns}}`` when run with tool info."""
    if not raw:
        return None
    where = "info.environment_info.tool_defs"
    specs = []
    for key, sig in _object(raw, where).items():
        sig = _object(sig, f"{where}.{key}")
        parameters = sig.get("params") or {"type": "object", "properties": {}}
        _check_schema(parameters, f"{where}.{key}.params")
        description = str(sig.get("doc") or "").strip()
        specs.append(ToolSpec(name=str(sig.get("name") or key), description=description, parameters=parameters))
    return specs


def _from_tau2(
    raw: Any, context: _Context, position: int, shared: _Tau2Shared
) -> tuple[Trajectory, list[ToolSpec] | None]:
    sim = _object(raw, "")
    if "task_id" not in sim:
        raise _Problem("task_id", "missing: a tau2 simulation needs a `task_id`")
    if sim.get("messages") is None:
        why = "full-duplex runs (ticks only) are not supported" if sim.get("ticks") else "missing"
        raise _Problem("messages", why)
    items, dropped = _tau2_messages(sim["messages"])
    if shared.policy and not (items and items[0][1].role == "system"):
        items.insert(0, ("info.environment_info.policy", Message(role="system", content=shared.policy)))
    task_id = str(sim["task_id"])
    trial = sim.get("trial") if sim.get("trial") is not None else position
    reward_info = sim.get("reward_info")
    reward_info = _object(reward_info, "reward_info") if reward_info is not None else None
    meta: dict[str, Any] = {
        "trial": trial,
        "simulation_id": sim.get("id"),
        "termination_reason": sim.get("termination_reason"),
    }
    meta.update({"reward_info": reward_info} if reward_info is not None else {})
    meta.update({"task": shared.tasks[task_id]} if task_id in shared.tasks else {})
    meta.update({"dropped_user_tool_calls": dropped} if dropped else {})
    messages, renamed = _link(items, id_field="id")
    meta.update({"renamed_tool_call_ids": renamed} if renamed else {})
    trajectory = Trajectory(
        id=f"{context.default_source}:{task_id}:{trial}",
        task_id=task_id,
        tools=[],
        messages=messages,
        reward=_reward(reward_info.get("reward"), "reward_info.reward") if reward_info is not None else None,
        source=context.default_source,
        model=context.model or shared.agent_llm or "",
        meta=meta,
    )
    return trajectory, shared.tools


def _tau2_messages(raw: Any) -> tuple[list[tuple[str, Message]], int]:
    """tau2 messages as OpenAI-shaped ones, and how many user-side tool calls were dropped."""
    items: list[tuple[str, Message]] = []
    dropped = 0
    unnamed: list[str] = []  # ids given to id-less calls, handed to the id-less tool messages in order
    flat: list[tuple[str, Any]] = []
    for i, message in enumerate(_list(raw, "messages")):
        if isinstance(message, dict) and message.get("role") == "tool" and "tool_messages" in message:
            subs = _list(message["tool_messages"], f"messages[{i}].tool_messages")
            flat += [(f"messages[{i}].tool_messages[{j}]", sub) for j, sub in enumerate(subs)]
        else:
            flat.append((f"messages[{i}]", message))
    if not flat:
        raise _Problem("messages", "empty: a trajectory needs at least one message")
    for where, message in flat:
        message = _object(message, where)
        role = message.get("role")
        if role not in ROLES:
            raise _Problem(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
        if role == "tool" and message.get("requestor") == "user":
            dropped += 1  # the user simulator's own tool result: not part of the agent's view
            continue
        if role == "user" and not _has_text(message.get("content")):
            continue  # a user turn that only called the user's tools
        if role == "tool":
            items.append((where, _tau2_tool_message(message, where, unnamed)))
            continue
        calls: tuple[ToolCall, ...] = ()
        if role == "assistant":
            raw_calls = _list(message.get("tool_calls") or [], f"{where}.tool_calls")
            calls = tuple(_tau2_tool_call(c, f"{where}.tool_calls[{j}]", where, j) for j, c in enumerate(raw_calls))
            unnamed = [c.id for c, r in zip(calls, raw_calls) if not (isinstance(r, dict) and r.get("id"))]
        content = _content(message.get("content"), f"{where}.content", role)
        items.append((where, Message(role=role, content=content, tool_calls=calls)))  # user tool_calls: dropped
    return items, dropped


def _tau2_tool_call(raw: Any, where: str, message_where: str, position: int) -> ToolCall:
    call = _object(raw, where)
    if call.get("requestor", "assistant") != "assistant":
        requestor = call.get("requestor")
        raise _Problem(f"{where}.requestor", f"an assistant message holds a call requested by {requestor!r}")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise _Problem(f"{where}.id", f"expected a string, got {type(call_id).__name__}")
    return ToolCall(
        id=call_id or f"call_{_digits(message_where)}_{position}",
        name=_tool_name(call.get("name"), f"{where}.name"),
        arguments=_arguments(call.get("arguments"), f"{where}.arguments"),
    )


def _tau2_tool_message(message: dict[str, Any], where: str, unnamed: list[str]) -> Message:
    call_id = message.get("id")
    if not call_id and unnamed:
        call_id = unnamed.pop(0)
    if not isinstance(call_id, str) or not call_id:
        raise _Problem(f"{where}.id", "missing: a tool message must give the id of the call it answers")
    content = _content(message.get("content"), f"{where}.content", "tool")
    return Message(role="tool", content=content, tool_call_id=call_id)


def _digits(where: str) -> str:
    """``messages[4].tool_messages[1]`` -> ``4_1``: a stable part for generated call ids."""
    numbered = [part for part in where.split(".") if any(ch.isdigit() for ch in part)]
    return "_".join("".join(ch for ch in part if ch.isdigit()) for part in numbered)


# ---------------------------------------------------------------- shared field checks


def _link(items: list[tuple[str, Message]], id_field: str = "tool_call_id") -> tuple[list[Message], int]:
    """Check that tool calls and tool messages pair up by id, name each tool message, and
    make call ids unique within the run; returns the messages and how many ids were renamed.

    The tool messages answering an assistant message come right after it, in any order.
    An assistant message that calls tools with blank text gets ``content=None``. Some logs
    reuse a call id in a later turn (the shared GPT-4o airline runs do); such a call and its
    answer get the id ``{id}_{n}``, so that an id names one call per run.
    """
    pending: dict[str, tuple[str, ToolCall]] = {}  # the original id -> (field, call with its final id)
    used: set[str] = set()
    renamed = 0
    out: list[Message] = []
    for where, message in items:
        if message.role == "tool":
            hit = pending.pop(message.tool_call_id or "", None)
            if hit is None:
                raise _Problem(
                    f"{where}.{id_field}",
                    f"{message.tool_call_id!r} matches no unanswered tool call of the assistant message before it",
                )
            call = hit[1]
            if message.name is not None and message.name != call.name:
                raise _Problem(f"{where}.name", f"{message.name!r} is not the name of call {call.id!r} ({call.name!r})")
            message = replace(message, name=call.name, tool_call_id=call.id)
        else:
            _no_unanswered(pending)
            if message.role == "assistant" and message.tool_calls:
                pending = _calls_by_id(message, where)
                calls = tuple(_unique_id(call, used) for _, call in pending.values())
                renamed += sum(new.id != old.id for new, (_, old) in zip(calls, pending.values()))
                pending = {key: (w, new) for (key, (w, _)), new in zip(pending.items(), calls)}
                content = message.content if (message.content or "").strip() else None
                message = replace(message, content=content, tool_calls=calls)
        out.append(message)
    _no_unanswered(pending)
    return out, renamed


def _unique_id(call: ToolCall, used: set[str]) -> ToolCall:
    new_id, n = call.id, 1
    while new_id in used:
        n += 1
        new_id = f"{call.id}_{n}"
    used.add(new_id)
    return call if new_id == call.id else replace(call, id=new_id)


def _calls_by_id(message: Message, where: str) -> dict[str, tuple[str, ToolCall]]:
    pending: dict[str, tuple[str, ToolCall]] = {}
    for j, call in enumerate(message.tool_calls):
        if call.id in pending:
            raise _Problem(f"{where}.tool_calls[{j}].id", f"{call.id!r} is used by two calls of this message")
        pending[call.id] = (f"{where}.tool_calls[{j}]", call)
    return pending


def _no_unanswered(pending: dict[str, tuple[str, ToolCall]]) -> None:
    if pending:
        where, call = next(iter(pending.values()))
        raise _Problem(where, f"no tool message answers call {call.id!r} ({call.name})")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Problem(where, f"expected a JSON object, got {_type_name(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Problem(where, f"expected a list, got {_type_name(value)}")
    return value


def _tool_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Problem(where, f"expected a tool name, got {_type_name(value)}")
    return value


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """Tool-call arguments as a dict, whether logged as a JSON string or an object."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = _strict_loads(value)
        except json.JSONDecodeError as exc:
            raise _Problem(where, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise _Problem(where, f"expected a JSON object of arguments, got {_type_name(value)}")
    return value


def _content(value: Any, where: str, role: str) -> str | None:
    """Message text: a string, None, or OpenAI text parts (joined). Tool results may be JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    if role == "tool" and isinstance(value, (dict, list, int, float, bool)):
        return json.dumps(value, ensure_ascii=False)
    raise _Problem(where, f"expected text (or a list of text parts), got {_type_name(value)}")


def _has_text(value: Any) -> bool:
    return (isinstance(value, str) and bool(value.strip())) or (isinstance(value, list) and bool(value))


def _reward(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Problem(where, f"expected a number or null, got {_type_name(value)}")
    return float(value)


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise _Problem(where, f"expected a JSON schema object, got {_type_name(schema)}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise _Problem(where, f"not a valid JSON schema: {exc.message}") from None


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# ---------------------------------------------------------------- tool schemas and ids


def _settle_tools(parsed: list[_Parsed], override: ToolsOverride | None) -> tuple[list[str], list[str]]:
    """Give every trajectory its tools: its own, or those inferred from all calls; then the tools file.

    Returns the names whose schema was inferred and warnings for the report.
    """
    calls = [c for p in parsed for m in p.trajectory.messages if m.role == "assistant" for c in m.tool_calls]
    inferred = infer_tool_specs(calls)
    used_inferred = False
    undeclared: Counter[str] = Counter()
    for p in parsed:
        base = p.declared_tools if p.declared_tools is not None else inferred
        used_inferred = used_inferred or p.declared_tools is None
        p.trajectory.tools = apply_override(base, override)
        known = {t.name for t in p.trajectory.tools}
        undeclared.update(c.name for m in p.trajectory.messages for c in m.tool_calls if c.name not in known)
    warnings = []
    renamed = [p.trajectory.meta.get("renamed_tool_call_ids", 0) for p in parsed]
    if any(renamed):
        warnings.append(
            f"{sum(renamed)} tool-call id(s) reused within a run, in {sum(map(bool, renamed))} run(s):"
            " renamed to `<id>_2`, ... (meta.renamed_tool_call_ids)"
        )
    if undeclared:
        listed = ", ".join(f"{name} ({n})" for name, n in sorted(undeclared.items()))
        warnings.append(f"calls to tools their record does not declare: {listed}")
    if override is not None:
        all_names = {t.name for p in parsed for t in p.trajectory.tools}
        unused = sorted((override.read_only | override.write) - all_names)
        if unused:
            guesses = [name + (f" (did you mean {g[0]!r}?)" if (g := difflib.get_close_matches(name, all_names, n=1))
                               else "") for name in unused]
            warnings.append(f"{override.path}: names no tool of the import: {', '.join(guesses)}")
    explicit = {t.name for t in override.tools} if override is not None else set()
    names = [t.name for t in inferred if t.name not in explicit] if used_inferred else []
    return names, warnings


def _duplicate_ids(parsed: list[_Parsed]) -> list[str]:
    first: dict[str, str] = {}
    problems = []
    for p in parsed:
        traj_id = p.trajectory.id
        if traj_id in first:
            problems.append(
                f"{p.label}: id: duplicate trajectory id {traj_id!r} (also {first[traj_id]});"
                " give each input its own source, or unique ids"
            )
        else:
            first[traj_id] = p.label
    return problems


_CONVERTERS: dict[str, Callable[[Any, _Context, int, Any], tuple[Trajectory, list[ToolSpec] | None]]] = {
    "openai": _from_openai,
    "tau": _from_tau,
    "tau2": _from_tau2,
}
