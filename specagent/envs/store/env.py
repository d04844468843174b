"""``StoreEnv``: the built-in online-store customer-service domain.

By default (``split=None``) episodes run the 42 hand-checked tasks on the seed
database in ticket mode: the user's first message says everything (identity, request,
confirmation); scripted follow-ups answer the agent if it asks. With ``split`` the
tasks are a generated split over the extended database (see ``generate``). Details a
task withholds (``withheld``: always in ``user="multi_turn"``, and the one missing
detail of the multi_turn category) are given only when an agent message asks for them
(contains one of their keywords); a message that asks for none of the pending ones ends
the conversation. An episode earns reward 1.0 when the final database equals the one
the task's gold actions produce and the agent told the user every required fact.
"""

from __future__ import annotations

import hashlib
import json
import pickle
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
# multi_turn (the opening lacks one detail the agent must ask for) exists only in the generated splits
ALL_CATEGORIES = CATEGORIES + ("multi_turn",)
SPLITS = ("train", "calibration", "eval")
USER_MODES = ("ticket", "multi_turn")
REQUIRED_KEYS = ("id", "category", "request", "gold_actions", "required_facts")
WRITE_TOOLS = frozenset(spec.name for spec in TOOL_SPECS if not spec.read_only)
READ_TOOLS = frozenset(spec.name for spec in TOOL_SPECS if spec.read_only)

POLICY = """You are an online store's customer service agent.
- First identify the user by email, or by name and zip. Act only on their orders.
- Look facts up with tools, never guess. One tool call at a time.
- The user's request is their confirmation: act without asking again.
- Pending orders can be cancelled (reason "no longer needed" or "ordered by mistake") or get a new address or payment method.
- Processed and cancelled orders cannot change.
- Delivered items can be returned or exchanged once per order, in one call. Refund to the original payment method or store credit. Exchange only for an available other variant of the same product; the payment method settles the price difference. Store credit must cover any charge.
- Refuse what breaks this policy and say why. Transfer to a human only if asked.
- Finally tell the user the outcome: statuses, amounts, ids."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def canonical_hash(db: dict[str, Any]) -> str:
    """sha256 of the database as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(_canonical(db).encode("utf-8")).hexdigest()


def normalize_text(text: str) -> str:
    """For fact matching: lower case, single spaces, amounts as "54.20" ("$54.2", "54.20" alike)."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text.lower())  # 1,054.20 -> 1054.20
    text = re.sub(r"\$\s*(\d+)(?!\d|\.\d)", r"\1.00", text)  # $37 -> 37.00
    text = re.sub(r"(?<![\w.])(\d+\.\d)(?!\d)", r"\g<1>0", text)  # 54.2 -> 54.20
    return " ".join(text.replace("$", "").split())


def asks_for(message: str, keywords: Sequence[str]) -> bool:
    """Whether an agent message asks for a withheld detail: it contains one of its keywords."""
    text = " ".join(message.lower().split())
    return any(keyword in text for keyword in keywords)


def check_store_task(task: dict[str, Any]) -> str | None:
    """What is wrong with a task for this domain, or None."""
    if task["category"] not in ALL_CATEGORIES:
        return f"category {task['category']!r} is not one of {', '.join(ALL_CATEGORIES)}"
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
    withheld = task.get("withheld", [])
    if not isinstance(withheld, list) or not all(_is_detail(d) for d in withheld):
        return "withheld must be a list of {name, question, keywords, answer, after}"
    return None


def _is_detail(detail: Any) -> bool:
    return (isinstance(detail, dict) and all(isinstance(detail.get(k), str) for k in ("question", "answer"))
            and isinstance(detail.get("keywords"), list) and isinstance(detail.get("after"), int))


class BaseDB:
    """A pristine database that episodes start from: never mutated, copied per reset.

    A pickle round trip copies JSON-like data like ``copy.deepcopy`` does, several times
    faster, which matters for the extended database (hundreds of users, reset per episode).
    ``hash_of`` is ``canonical_hash`` for a database derived from this one, computed from
    the canonical text of each unchanged record, kept from the first call.
    """

    def __init__(self, db: dict[str, Any]) -> None:
        self.db = db
        self._blob = pickle.dumps(db, protocol=pickle.HIGHEST_PROTOCOL)
        self.hash = canonical_hash(db)
        self._texts: dict[str, dict[str, str]] | None = None

    def fresh(self) -> dict[str, Any]:
        return pickle.loads(self._blob)

    def hash_of(self, db: dict[str, Any]) -> str:
        """Equals ``canonical_hash(db)`` (the text is built the same way, table by table and
        record by record), but re-encodes only records that differ from this database's.
        A record equal (==) to its original is taken as encoding alike: the tools write
        strings, lists of strings and rounded floats, never an equal value of another type."""
        if self._texts is None:
            self._texts = {t: {k: f"{_canonical(k)}:{_canonical(r)}" for k, r in records.items()}
                           for t, records in self.db.items() if isinstance(records, dict)}
        parts = []
        for table in sorted(db):
            records, base, texts = db[table], self.db.get(table), self._texts.get(table)
            if not isinstance(records, dict) or texts is None:
                parts.append(f"{_canonical(table)}:{_canonical(records)}")
                continue
            items = [texts[k] if k in base and records[k] == base[k] else f"{_canonical(k)}:{_canonical(records[k])}"
                     for k in sorted(records)]
            parts.append(f"{_canonical(table)}:{{{','.join(items)}}}")
        return hashlib.sha256(f"{{{','.join(parts)}}}".encode("utf-8")).hexdigest()


def mode_view(task: dict[str, Any], user: str) -> dict[str, Any]:
    """The task as ``user`` mode plays it: ``request`` is the opening, ``withheld`` the details
    given only when asked. Ticket mode is the record itself."""
    if user == "ticket":
        return task
    if "user_modes" not in task:
        from specagent.envs.store.generate import with_user_modes

        task = with_user_modes(task)
    return {**task, **task["user_modes"][user]}


class StoreEnv:
    """Online-store customer service: users, orders, products, returns; 14 tools.

    ``write_log`` lists every state-changing call that reached ``execute`` since the
    last ``reset``, whether or not the tool accepted it.
    """

    name = "store"
    # gold hashes of the generated splits, shared by every env of this process: (split, task id) -> hash
    _split_gold: dict[tuple[str, str], str] = {}

    def __init__(
        self, tasks_path: str | Path | None = None, split: str | None = None, user: str = "ticket",
        per_kind: int | None = None,
    ) -> None:
        """``split=None``: the hand-checked tasks of ``tasks_path`` (default tasks.jsonl) on the
        seed database. ``split``: that generated split ("train", "calibration", "eval") on the
        extended database; eval also holds the hand-checked tasks, which keep the seed
        database (their facts, e.g. return id R004, assume its 3 returns). ``user``: "ticket"
        or "multi_turn" (identity and order ids withheld until asked). ``per_kind`` (a split
        only): that many generated tasks of every kind instead of the split's own count (more:
        the split's tasks unchanged, then each kind's extra ones; generate.build_split_tasks)."""
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)} or None, not {split!r}")
        if user not in USER_MODES:
            raise ValueError(f"user must be one of {', '.join(USER_MODES)}, not {user!r}")
        if split is not None and tasks_path is not None:
            raise ValueError("give a split or a tasks_path, not both")
        if per_kind is not None and split is None:
            raise ValueError("per_kind sizes a generated split: give a split too")
        self.split, self.user = split, user
        self.tasks_path = Path(tasks_path) if tasks_path is not None else TASKS_PATH
        if split is None:
            tasks = load_jsonl_tasks(self.tasks_path, REQUIRED_KEYS, check_store_task)
            self._bases = {"seed": BaseDB(json.loads(DB_PATH.read_text(encoding="utf-8")))}
        else:
            from specagent.envs.store import generate

            tasks, self._bases = generate.split_tasks(split, per_kind), generate.bases()
        self._tasks = {str(task["id"]): mode_view(task, user) for task in tasks}
        self._gold_hashes: dict[str, str] = {}
        self._base = self._bases["extended" if split else "seed"]
        self._db = self._base.fresh()
        self._hash: str | None = None  # split envs: the state hash, cached until a write call runs
        self._task: dict[str, Any] | None = None
        self._followups: list[str] = []
        self._pending: list[dict[str, Any]] = []
        self.write_log: list[ToolCall] = []

    # ------------------------------------------------------------ the Environment protocol

    def tool_specs(self) -> list[ToolSpec]:
        return list(TOOL_SPECS)

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def reset(self, task_id: str) -> list[Message]:
        """Fresh database for ``task_id``; returns the policy and the user's opening request."""
        self._task = self.task(task_id)
        self._base = self._base_of(self._task)
        self._db = self._base.fresh()
        self._hash = self._base.hash
        self._followups = list(self._task.get("followups", []))
        self._pending = list(self._task.get("withheld", []))
        self.write_log = []
        return [Message(role="system", content=POLICY), Message(role="user", content=self._task["request"])]

    def execute(self, call: ToolCall) -> str:
        if isinstance(call.name, str) and call.name in WRITE_TOOLS:
            self.write_log.append(call)
        if not (isinstance(call.name, str) and call.name in READ_TOOLS):
            self._hash = None  # only a read-only tool is known to leave the state as it was
        return run_tool(self._db, call.name, call.arguments)

    def is_terminal(self, call: ToolCall) -> bool:
        return isinstance(call.name, str) and call.name in TERMINAL_TOOLS

    def user_turn(self, reply: str) -> str | None:
        """The user's answer to an agent message, or None when the user has nothing more to say.

        While details are withheld, the user gives each one the message asks for (contains
        one of its keywords), and nothing if it asks for none of them. Once all are given,
        the scripted follow-ups come in order, whatever the message.
        """
        if self._pending:
            asked = [d for d in self._pending if asks_for(reply, d["keywords"])]
            self._pending = [d for d in self._pending if d not in asked]
            return " ".join(d["answer"] for d in asked) or None
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

    def close(self) -> None:
        """Nothing to end: the store lives in memory."""

    def expert(self):
        """The scripted expert of this environment's tasks (`envs/store/expert.py`)."""
        from specagent.envs.store.expert import expert_policy

        return expert_policy(self)

    def state_hash(self) -> str:
        if self.split is None:  # the hand-checked set hashes every time, as it always did
            return canonical_hash(self._db)
        if self._hash is None:  # hashing the extended database costs ms: once per state, incrementally
            self._hash = self._base.hash_of(self._db)
        return self._hash

    # ------------------------------------------------------------ helpers for graders and experts

    def task(self, task_id: str) -> dict[str, Any]:
        """The task's record as this env's user mode plays it (``request`` is the opening).
        Shared with the task cache: do not modify it."""
        if task_id not in self._tasks:
            where = f"split {self.split!r}" if self.split else str(self.tasks_path)
            raise KeyError(f"unknown store task {task_id!r}; see StoreEnv().task_ids() or {where}")
        return self._tasks[task_id]

    def initial_hash(self) -> str:
        """Hash of the database the current (or, before any reset, the default) task starts from."""
        return self._base.hash

    def gold_hash(self, task_id: str) -> str:
        """Hash of the database after replaying the task's gold actions on a fresh copy."""
        cache, key = (self._gold_hashes, task_id) if self.split is None else (self._split_gold, (self.split, task_id))
        if key not in cache:
            task, db = self.task(task_id), None
            base = self._base_of(task)
            for action in task["gold_actions"]:
                db = base.fresh() if db is None else db
                run_tool(db, action["name"], action["arguments"])
            if db is None:  # no actions: the start state
                cache[key] = base.hash
            else:
                cache[key] = canonical_hash(db) if self.split is None else base.hash_of(db)
        return cache[key]

    def _base_of(self, task: dict[str, Any]) -> BaseDB:
        """Generated tasks (they carry their ``split``) start from the extended database, also
        when read from a task file; hand-checked ones from the seed."""
        if "split" not in task:
            return self._bases["seed"]
        if "extended" not in self._bases:
            from specagent.envs.store import generate

            self._bases = {**self._bases, "extended": generate.bases()["extended"]}
        return self._bases["extended"]
