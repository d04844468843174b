"""``McpEnv``: the tools of one or more MCP servers, tasks from a YAML or JSONL file.

A task is a mapping with

- ``id`` and ``request`` (the opening user message), both required;
- ``system``: the system prompt (default: the servers' instructions, if any);
- ``followups``: what the user says after each agent reply, in order;
- gold checks, each optional: ``required_facts`` (strings every one of which some
  agent reply must contain, compared case- and amount-insensitively) and
  ``gold_actions`` (the state-changing calls, ``{name, arguments}``, that must
  succeed in this order and no others).

The built-in store's tasks.jsonl is in this format, so the store served over MCP
(`specagent env serve-mcp builtin`) runs its own tasks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from specagent.core.canonical import canonical_call
from specagent.core.classify import check_tool_names, classify_tools
from specagent.core.errors import ConfigError, TaskFileError
from specagent.core.files import read_text
from specagent.core.interfaces import Reward
from specagent.core.types import Message, ToolCall, ToolSpec
from specagent.envs.mcp.client import McpClients, McpServer, tool_spec
from specagent.envs.store.env import normalize_text
from specagent.envs.tasks import load_jsonl_tasks

REQUIRED_KEYS = ("id", "request")
CHECKS = ("required_facts", "gold_actions")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def task_problem(task: dict[str, Any]) -> str | None:
    """What is wrong with an MCP task, or None."""
    if not isinstance(task["request"], str) or not task["request"].strip():
        return "request must be a non-empty string"
    if not isinstance(task.get("system", ""), str):
        return "system must be a string"
    for key in ("required_facts", "followups"):
        if key in task and not _strings(task[key]):
            return f"{key} must be a list of strings"
    actions = task.get("gold_actions", [])
    if not isinstance(actions, list) or not all(
        isinstance(a, dict) and isinstance(a.get("name"), str) and isinstance(a.get("arguments", {}), dict)
        for a in actions
    ):
        return "gold_actions must be a list of {name, arguments}"
    return None


def _yaml_tasks(path: Path) -> list[dict[str, Any]]:
    text = read_text(path, "task file")
    try:
        tasks = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TaskFileError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(tasks, list):
        raise TaskFileError(f"{path}: the top level must be a list of tasks")
    seen: set[str] = set()
    for number, task in enumerate(tasks):
        where = f"{path}: task {number}"
        if not isinstance(task, dict):
            raise TaskFileError(f"{where}: expected a mapping, got {type(task).__name__}")
        missing = [key for key in REQUIRED_KEYS if key not in task]
        problem = f"missing required key(s) {', '.join(missing)}" if missing else task_problem(task)
        if problem:
            raise TaskFileError(f"{where}: {problem}")
        if str(task["id"]) in seen:
            raise TaskFileError(f"{where}: duplicate task id {task['id']!r}")
        seen.add(str(task["id"]))
    return tasks


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Tasks from a ``.yaml``/``.yml`` file (a list of mappings) or a JSONL file."""
    path = Path(path)
    if path.suffix in (".yaml", ".yml"):
        return _yaml_tasks(path)
    return load_jsonl_tasks(path, REQUIRED_KEYS, task_problem)


class McpEnv:
    """Tools of MCP servers as an Environment; one session per server for the env's life.

    A tool is read-only by DESIGN §1 precedence: the user's ``read_only``/``write``
    lists, then the server's ``readOnlyHint``, else write. A tool name offered by two
    servers is an error. Tool calls time out after ``tool_timeout_s``; error results,
    protocol errors and timeouts come back as "Error: ..." observations.

    ``write_log`` lists the state-changing calls that succeeded since the last reset.
    MCP has no standard way to read a server's state, so ``state_hash`` hashes that
    log, and the reward compares it with the task's ``gold_actions``. Call ``close``
    (or use ``with``) to end the sessions.
    """

    name = "mcp"

    def __init__(
        self,
        servers: Sequence[McpServer],
        tasks: Iterable[dict[str, Any]] = (),
        *,
        read_only: Sequence[str] = (),
        write: Sequence[str] = (),
        tool_timeout_s: float = 30.0,
        terminal_tools: Sequence[str] = (),
    ) -> None:
        self._tasks = {str(task["id"]): task for task in tasks}
        self.tool_timeout_s = tool_timeout_s
        self.terminal_tools = frozenset(terminal_tools)
        self._task: dict[str, Any] | None = None
        self._followups: list[str] = []
        self.write_log: list[ToolCall] = []
        self._clients = McpClients(servers)
        try:
            self._specs, self._server_of = self._collect_tools()
            # the user's lists (a misspelt name is an error) > the server's hint > write; terminal
            # tools are never read-only. tool_specs() carries the result, so every caller of
            # this environment (CLI or Python API) classifies the same way.
            check_tool_names(terminal_tools, self._server_of, "mcp.terminal_tools")
            self.read_only = classify_tools(self._specs, read_only, write, terminal=terminal_tools)
            self._specs = [replace(spec, read_only=self.read_only[spec.name]) for spec in self._specs]
            self._check_gold_actions()
        except BaseException:
            self._clients.close()
            raise

    def _collect_tools(self) -> tuple[list[ToolSpec], dict[str, str]]:
        specs: list[ToolSpec] = []
        server_of: dict[str, str] = {}
        for server, session in self._clients.sessions.items():
            for tool in session.tools:
                if tool.name in server_of:
                    raise ConfigError(
                        f"env.mcp.servers: tool {tool.name!r} is offered by both {server_of[tool.name]!r} and "
                        f"{server!r}; tool names must be unique across servers (drop or change one server)"
                    )
                server_of[tool.name] = server
                specs.append(tool_spec(tool))
        return specs, server_of

    def _check_gold_actions(self) -> None:
        for task_id, task in self._tasks.items():
            for number, action in enumerate(task.get("gold_actions", [])):
                name = action["name"]
                if name not in self.read_only:
                    raise TaskFileError(f"task {task_id}: gold_actions[{number}]: no MCP server offers {name!r}")
                if self.read_only[name]:
                    raise TaskFileError(
                        f"task {task_id}: gold_actions[{number}] expects a write, but {name!r} counts as read-only "
                        "(the server's hint or env.read_only); if it changes state, list it under env.write"
                    )

    # ------------------------------------------------------------ the Environment protocol

    def tool_specs(self) -> list[ToolSpec]:
        """The servers' tools; ``read_only`` as classified: the user's lists over the server's hint."""
        return list(self._specs)

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def reset(self, task_id: str) -> list[Message]:
        """Start the task: restart servers marked ``restart_each_task``; the system prompt
        (the task's, else the servers' instructions) and the user's request."""
        task = self.task(task_id)
        self._clients.restart_used()
        self._task, self._followups, self.write_log = task, list(task.get("followups", [])), []
        system = task.get("system") or self._clients.instructions()
        opening = [Message(role="system", content=system)] if system else []
        return opening + [Message(role="user", content=task["request"])]

    def execute(self, call: ToolCall) -> str:
        server = self._server_of.get(call.name)
        if server is None:
            return f"Error: unknown tool '{call.name}'"
        observation, ok = self._clients.call(server, call.name, call.arguments, self.tool_timeout_s)
        if ok and not self.read_only[call.name]:
            self.write_log.append(call)
        return observation

    def is_terminal(self, call: ToolCall) -> bool:
        return call.name in self.terminal_tools

    def user_turn(self, reply: str) -> str | None:
        """The task's next follow-up, or None when the user has nothing more to say."""
        return self._followups.pop(0) if self._followups else None

    def reward(self, messages: Sequence[Message]) -> Reward:
        """1.0 iff every gold check of the task passes; 0.0 with ``checked: False`` when it has none."""
        if self._task is None:
            raise RuntimeError("McpEnv.reward called before reset(task_id)")
        info: dict[str, Any] = {}
        if "required_facts" in self._task:
            said = [normalize_text(m.content) for m in messages if m.role == "assistant" and m.content]
            info["missing_facts"] = [
                fact for fact in self._task["required_facts"] if not any(normalize_text(fact) in s for s in said)
            ]
        if "gold_actions" in self._task:
            expected = [canonical_call(a["name"], a.get("arguments", {})) for a in self._task["gold_actions"]]
            info["writes_match"] = expected == self._executed_writes()
        if not info:
            reason = f"task {self._task['id']} has no gold checks ({', '.join(CHECKS)}): reward unknown"
            return Reward(0.0, {"checked": False, "reason": reason})
        passed = not info.get("missing_facts") and info.get("writes_match", True)
        return Reward(1.0 if passed else 0.0, {"checked": True, **info, "executed_writes": self._executed_writes()})

    def state_hash(self) -> str:
        """sha256 of the successful state-changing calls so far, in canonical form.

        MCP servers expose no standard state hash, so the sequence of executed writes
        stands for the state: two episodes that made the same writes in the same order
        hash alike.
        """
        return hashlib.sha256(json.dumps(self._executed_writes()).encode("utf-8")).hexdigest()

    # ------------------------------------------------------------ helpers

    def _executed_writes(self) -> list[str]:
        return [canonical_call(call.name, call.arguments) for call in self.write_log]

    def expert(self):
        """The store's scripted expert over these tasks (they carry its `expert_lookups`,
        `gold_actions` and `expert_reply`): the `scripted` backend in tests."""
        from specagent.envs.store.expert import expert_policy

        return expert_policy(self)

    def task(self, task_id: str) -> dict[str, Any]:
        """The task's record as loaded from the task file."""
        if task_id not in self._tasks:
            raise KeyError(f"unknown MCP task {task_id!r}; known: {', '.join(self._tasks) or 'none'}")
        return self._tasks[task_id]

    def close(self) -> None:
        """End the sessions; stdio servers exit."""
        self._clients.close()

    def __enter__(self) -> "McpEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


