"""``AirlineEnv``: tau-bench's airline domain, live, on the user's copy of its data.

Each episode starts from a fresh database. The user side is one of:

- ``ticket``: the task's instruction becomes one opening request that also gives consent
  in advance; the user never answers, so the episode ends at the agent's first message
  to the user (or at a transfer).
- ``simulated``: a model (any ``ChatEngine``) plays the user from the instruction, as
  tau-bench's simulated user does; the conversation ends when it says ``###STOP###``.

Grading is tau-bench's: reward 1.0 when the final database hash equals the hash after the
task's gold actions on a fresh database, and every required output of the task appears in
a message the agent sent the user (case-insensitive, commas removed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Sequence

from specagent.core.interfaces import ChatEngine, ChatRequest, Reward
from specagent.core.types import Message, ToolCall, ToolSpec
from specagent.envs.airline.data import AirlineData, load_airline_data
from specagent.envs.airline.tools import TERMINAL_TOOLS, TOOL_SPECS, Database, run_tool

STOP = "###STOP###"
AGENT_GREETING = "Hi! How can I help you today?"  # what the simulated user first hears, as in tau-bench

SIMULATED_USER_PROMPT = """You play a customer writing to an airline's customer service agent.

Your situation and goals (they address you as "you"):
{instruction}

Rules:
- Write only your next message to the agent: short, in your own words, one step at a time.
- Give a piece of information only when the agent needs it; never paste these notes.
- Never invent facts (ids, names, dates, amounts) the notes do not give; say you do not know.
- When your goals are met, or clearly cannot be, reply with {stop} alone to end the conversation."""


def ticket_request(task: dict[str, Any]) -> str:
    """The opening request of ticket mode: the instruction verbatim, framed as the user's notes."""
    return (
        'I need help with my reservations. Here are my notes on what I want (they call me "you"):\n\n'
        f"{task['instruction'].strip()}\n\n"
        "That is all I can tell you, and I cannot reply to questions: wherever these notes call for an "
        "action, take this message as my explicit confirmation (yes) to go ahead."
    )


class AirlineEnv:
    """The tau-bench airline domain (14 tools) behind the ``Environment`` protocol."""

    name = "airline"

    def __init__(
        self,
        data_dir: str | Path,
        runs: str | Path | None = None,
        *,
        user: Literal["ticket", "simulated"] = "ticket",
        user_engine: ChatEngine | None = None,
        user_max_tokens: int = 256,
        strict: bool = True,
    ) -> None:
        if user == "simulated" and user_engine is None:
            raise ValueError("AirlineEnv(user='simulated') needs a user_engine (the model that plays the user)")
        # strict=False: runs that cannot be read are left out (see load_airline_data), for conformance checks
        self.data: AirlineData = load_airline_data(data_dir, runs, strict=strict)
        self.user, self.user_engine, self.user_max_tokens = user, user_engine, user_max_tokens
        self._gold_hashes: dict[str, str] = {}
        self._db: Database | None = None  # reset() gives each episode a fresh one
        self._task_id: str | None = None
        self._user_chat: list[Message] = []

    # ------------------------------------------------------------ the Environment protocol

    def close(self) -> None:
        """Nothing to end: the database lives in memory (a simulated user's engine is the runtime's)."""

    def tool_specs(self) -> list[ToolSpec]:
        return list(TOOL_SPECS)

    def task_ids(self) -> list[str]:
        return list(self.data.tasks)

    def reset(self, task_id: str) -> list[Message]:
        """Fresh database for ``task_id``; returns the policy and the user's opening message."""
        task = self.task_record(task_id)
        self._task_id, self._db = task_id, self.data.fresh_db()
        if self.user == "ticket":
            opening = ticket_request(task)
        else:
            prompt = SIMULATED_USER_PROMPT.format(instruction=task["instruction"].strip(), stop=STOP)
            self._user_chat = [Message(role="system", content=prompt), Message(role="user", content=AGENT_GREETING)]
            opening = self._simulated_user_says()
        return [Message(role="system", content=self.data.policy), Message(role="user", content=opening)]

    def execute(self, call: ToolCall) -> str:
        return run_tool(self._state(), call.name, call.arguments)

    def is_terminal(self, call: ToolCall) -> bool:
        return call.name in TERMINAL_TOOLS

    def user_turn(self, reply: str) -> str | None:
        """Ticket mode: None (the conversation is over). Simulated: the user's answer, or
        None once the user model says ``###STOP###``."""
        if self.user == "ticket":
            return None
        self._user_chat.append(Message(role="user", content=reply))
        answer = self._simulated_user_says()
        return None if STOP in answer else answer

    def reward(self, messages: Sequence[Message]) -> Reward:
        """1.0 iff the database matches the gold one and every required output was said."""
        if self._task_id is None:
            raise RuntimeError("AirlineEnv.reward called before reset(task_id)")
        gold, final = self.gold_hash(self._task_id), self.state_hash()
        said = [(m.content or "").lower().replace(",", "") for m in messages if m.role == "assistant"
                and not m.tool_calls]
        outputs = {o: any(o.lower() in text for text in said) for o in self.task_record(self._task_id)["outputs"]}
        info = {"db_match": gold == final, "outputs": outputs, "gold_hash": gold, "final_hash": final}
        return Reward(reward=1.0 if gold == final and all(outputs.values()) else 0.0, info=info)

    def state_hash(self) -> str:
        return self.data.hash(self._state())

    # ------------------------------------------------------------ for graders and checks

    def task_record(self, task_id: str) -> dict[str, Any]:
        """The task as the runs record it: ``user_id``, ``instruction``, ``actions``, ``outputs``."""
        if task_id not in self.data.tasks:
            raise KeyError(f"unknown airline task {task_id!r}; the runs have tasks {', '.join(self.data.tasks)}")
        return self.data.tasks[task_id]

    def gold_hash(self, task_id: str) -> str:
        """The database hash after the task's gold actions on a fresh database."""
        if task_id not in self._gold_hashes:
            db = self.data.fresh_db()
            for action in self.task_record(task_id)["actions"]:
                if action["name"] not in TERMINAL_TOOLS:  # tau-bench skips them too
                    run_tool(db, action["name"], action["kwargs"])
            self._gold_hashes[task_id] = self.data.hash(db)
        return self._gold_hashes[task_id]

    def _state(self) -> Database:
        if self._db is None:
            raise RuntimeError("AirlineEnv: call reset(task_id) first")
        return self._db

    def _simulated_user_says(self) -> str:
        """The user model's next line; it sees the agent as "user" and itself as "assistant"."""
        assert self.user_engine is not None
        request = ChatRequest(list(self._user_chat), (), self.user_max_tokens)
        text = (self.user_engine.chat([request])[0].message.content or "").strip()
        self._user_chat.append(Message(role="assistant", content=text))
        return text
