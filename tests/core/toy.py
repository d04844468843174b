"""A tiny key-value environment and adversarial scripted models for protocol tests."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Sequence

from specagent.core.interfaces import Reward
from specagent.core.types import Message, ToolCall, ToolSpec

OBJ = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
SET = {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "integer"}},
       "required": ["key", "value"]}


class ToyEnv:
    """Keys a..e with integer values. `get`/`list_keys` read, `set`/`delete` write,
    `transfer` ends the episode; `peek` is declared read-only by nobody (unknown -> write)."""

    name = "toy"

    def __init__(self) -> None:
        self.db: dict[str, int] = {}
        self.write_log: list[str] = []  # call ids of executed state-changing calls
        self.turns = 0

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec("get", "read a key", OBJ, read_only=True),
            ToolSpec("list_keys", "list keys", {"type": "object", "properties": {}}, read_only=True),
            ToolSpec("set", "write a key", SET, read_only=False),
            ToolSpec("delete", "delete a key", OBJ, read_only=False),
            ToolSpec("transfer", "hand over", {"type": "object", "properties": {}}, read_only=False),
            ToolSpec("peek", "undeclared", OBJ, read_only=None),
        ]

    def task_ids(self) -> list[str]:
        return ["t0", "t1"]

    def reset(self, task_id: str) -> list[Message]:
        self.db = {k: i for i, k in enumerate("abcde")}
        self.write_log, self.turns = [], 0
        return [Message(role="system", content="toy policy"), Message(role="user", content=f"task {task_id}")]

    def execute(self, call: ToolCall) -> str:
        key = call.arguments.get("key")
        if call.name in ("get", "peek"):
            return json.dumps(self.db.get(key, "Error: no such key"))
        if call.name == "list_keys":
            return json.dumps(sorted(self.db))
        self.write_log.append(call.id)
        if call.name == "set":
            self.db[key] = call.arguments["value"]
        elif call.name == "delete":
            self.db.pop(key, None)
        return "ok"

    def close(self) -> None:
        pass

    def is_terminal(self, call: ToolCall) -> bool:
        return call.name == "transfer"

    def user_turn(self, reply: str) -> str | None:
        self.turns += 1
        return "go on" if self.turns < 2 else None

    def reward(self, messages: Sequence[Message]) -> Reward:
        return Reward(float(self.db.get("a") == 7))

    def state_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.db, sort_keys=True).encode()).hexdigest()


ACTIONS = ("get", "list_keys", "set", "delete", "transfer", "peek", "reply", "malformed", "get2")


def random_policy(seed: int, allow_malformed: bool = True):
    """A deterministic model: its step is a function of (seed, conversation) only."""

    def policy(messages: Sequence[Message], tools):
        digest = hashlib.sha256(f"{seed}:{json.dumps([m.to_openai() for m in messages], sort_keys=True)}".encode())
        rng = random.Random(digest.hexdigest())
        actions = ACTIONS if allow_malformed else tuple(a for a in ACTIONS if a != "malformed")
        # read-heavy, like real agents
        action = rng.choice(actions + ("get", "get", "list_keys"))
        key = rng.choice("abcdef")
        if action == "reply":
            return Message(role="assistant", content=f"answer {rng.randint(0, 9)}")
        if action == "malformed":
            return Message(role="assistant", content="<tool_call>{oops"), "bad json"
        if action == "get2":  # two read calls in one step
            calls = (ToolCall("x", "get", {"key": key}), ToolCall("y", "list_keys", {}))
            return Message(role="assistant", tool_calls=calls)
        args = {"set": {"key": key, "value": rng.randint(0, 9)}, "get": {"key": key},
                "delete": {"key": key}, "peek": {"key": key}}.get(action, {})
        return Message(role="assistant", tool_calls=(ToolCall("x", action, args),))

    return policy
