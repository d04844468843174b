"""``StoreEnv``: the built-in online-store customer-service domain.

Episodes run in ticket mode: the user's first message says everything (identity,
request, confirmation); scripted follow-ups answer the agent if it asks. An episode
earns reward 1.0 when the final database equals the one the task's gold actions
produce and the agent told the user every required fact.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Sequence

from specagent.core.interfaces import Reward
from specagent.core.types import Message, ToolCall, ToolSpec
from specagent.envs.store.tools import TERMINAL_TOOLS, TOOL_SPECS, argument_problem, run_tool
from specagent.envs.tasks import load_jsonl_tasks

DATA_DIR = Path(__file__).parent
DB_PATH = DATA_DIR / "db.json"
TASKS_PATH = DATA_DIR / "tasks.jsonl"

CATEGORIES = ("lookup", "single_write", "lookups_then_write", "policy_forbids", "multi_write")
REQUIRED_KEYS = ("id", "category", "request", "gold_actions", "required_facts")
WRITE_TOOLS = frozenset(spec.name for spec in TOOL_SPECS if not spec.read_only)

POLICY = """You are an online store's customer service agent.
- First identify the user by email, or by name and zip. Act only on their orders.
- Look facts up with tools, never guess. One tool call at a time.
- The user's request is their confirmation: act without asking again.
- Pending orders can be cancelled (reason "no longer needed" or "ordered by mistake") or get a new address or payment method.
- Processed and cancelled orders cannot change.
- Delivered items can be returned or exchanged once per order, in one call. Refund to the original payment method or store credit. Exchange only for an available other variant of the same product; the payment method settles the price difference. Store credit must cover any charge.
- Refuse what breaks this policy and say why. Transfer to a human only if asked.
- Finally tell the user the outcome: statuses, amounts, ids."""


def canonical_hash(db: dict[str, Any]) -> str:
    """sha256 of the database as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(db, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def normalize_text(text: str) -> str:
    """For fact matching: lower case, single spaces, amounts as "54.20" ("$54.2", "54.20" alike)."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text.lower())  # 1,054.20 -> 1054.20
    text = re.sub(r"\$\s*(\d+)(?!\d|\.\d)", r"\1.00", text)  # $37 -> 37.00
    text = re.sub(r"(?<![\w.])(\d+\.\d)(?!\d)", r"\g<1>0", text)  # 54.2 -> 54.20
    return " ".join(text.replace("$", "").split())


def check_store_task(task: dict[str, Any]) -> str | None:
    """What is wrong with a task for this domain, or None."""
    if task["category"] not in CATEGORIES:
        return f"category {task['category']!r} is not one of {', '.join(CATEGORIES)}"
    if not isinstance(task["request"], str) or not task["request"].strip():
        return "request must be a non-empty string"
    for key in ("required_facts", "followups"):
        values = task.get(key, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return f"{key} must be a list of strings"
    if not isinstance(task["gold_actions"], list):
        return "gold_actions must be a list of {name, arguments}"
    for number, action in enumerate(task["gold_actions"]):
        if not isinstance(action, dict) or action.get("name") not in WRITE_TOOLS:
            return f"gold_actions[{number}] must name a state-changing tool ({', '.join(sorted(WRITE_TOOLS))})"
        problem = argument_problem(action["name"], action.get("arguments"))
        if problem:
            return f"gold_actions[{number}] ({action['name']}): {problem}"
    return None


class StoreEnv:
    """Online-store customer service: users, orders, products, returns; 14 tools.

    ``write_log`` lists every state-changing call that reached ``execute`` since the
    last ``reset``, whether or not the tool accepted it.
    """

    name = "store"

    def __init__(self, tasks_path: str | Path | None = None) -> None:
        self.tasks_path = Path(tasks_path) if tasks_path is not None else TASKS_PATH
        tasks = load_jsonl_tasks(self.tasks_path, REQUIRED_KEYS, check_store_task)
        self._tasks = {str(task["id"]): task for task in tasks}
        self._seed_db = json.loads(DB_PATH.read_text(encoding="utf-8"))
        self._gold_hashes: dict[str, str] = {}
        self._db = copy.deepcopy(self._seed_db)
        self._task: dict[str, Any] | None = None
        self._followups: list[str] = []
        self.write_log: list[ToolCall] = []

    # ------------------------------------------------------------ the Environment protocol

    def tool_specs(self) -> list[ToolSpec]:
        return list(TOOL_SPECS)

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def reset(self, task_id: str) -> list[Message]:
        """Fresh database for ``task_id``; returns the policy and the user's request."""
        self._task = self.task(task_id)
        self._db = copy.deepcopy(self._seed_db)
        self._followups = list(self._task.get("followups", []))
        self.write_log = []
        return [Message(role="system", content=POLICY), Message(role="user", content=self._task["request"])]

    def execute(self, call: ToolCall) -> str:
        if isinstance(call.name, str) and call.name in WRITE_TOOLS:
            self.write_log.append(call)
        return run_tool(self._db, call.name, call.arguments)

    def is_terminal(self, call: ToolCall) -> bool:
        return isinstance(call.name, str) and call.name in TERMINAL_TOOLS

    def user_turn(self, reply: str) -> str | None:
        """The next scripted follow-up, or None when the user has nothing more to say."""
        return self._followups.pop(0) if self._followups else None

    def reward(self, messages: Sequence[Message]) -> Reward:
        """1.0 iff the database matches the gold one and every required fact was said."""
        if self._task is None:
            raise RuntimeError("StoreEnv.reward called before reset(task_id)")
        gold, final = self.gold_hash(str(self._task["id"])), self.state_hash()
        said = [normalize_text(m.content) for m in messages if m.role == "assistant" and m.content]
        missing = [f for f in self._task["required_facts"] if not any(normalize_text(f) in s for s in said)]
        info = {"db_match": gold == final, "missing_facts": missing, "gold_hash": gold, "final_hash": final}
        return Reward(reward=1.0 if gold == final and not missing else 0.0, info=info)

    def state_hash(self) -> str:
        return canonical_hash(self._db)

    # ------------------------------------------------------------ helpers for graders and experts

    def task(self, task_id: str) -> dict[str, Any]:
        """The task's record as loaded from the task file."""
        if task_id not in self._tasks:
            raise KeyError(f"unknown store task {task_id!r}; see StoreEnv().task_ids() or {self.tasks_path}")
        return self._tasks[task_id]

    def initial_hash(self) -> str:
        """Hash of the seed database, the state every episode starts from."""
        return canonical_hash(self._seed_db)

    def gold_hash(self, task_id: str) -> str:
        """Hash of the database after replaying the task's gold actions on a fresh copy."""
        if task_id not in self._gold_hashes:
            db = copy.deepcopy(self._seed_db)
            for action in self.task(task_id)["gold_actions"]:
                run_tool(db, action["name"], action["arguments"])
            self._gold_hashes[task_id] = canonical_hash(db)
        return self._gold_hashes[task_id]
