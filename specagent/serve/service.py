"""The runtime behind `specagent serve`: the engines, episodes, and chat conversations.

An episode runs a task from a fresh environment, as `specagent run` does. A chat turn
runs the SpecAgent protocol until the agent's next message to the user, who is the client.
Tools run server-side under the protocol's rules: read-only steps are executed as drafted,
a state-changing step is held until the strong model approves it.

The client's history is context, never a list of actions (DESIGN §1): the server executes
only the calls it approved or authored itself. Each conversation therefore lives on the
server: the first turn starts a fresh environment for the task and returns a
`conversation_id`; a later turn names that id and sends the history back, which must be
the server's own record of the conversation followed by the user's new message(s). A
history that differs from the record (a forged or edited tool call, an earlier reply
rewritten) is refused, and no earlier call is ever run again: the conversation's
environment keeps the state its approved calls left.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from specagent.config import ServeConfig
from specagent.core.canonical import canonical_call
from specagent.core.errors import SpecAgentError
from specagent.core.interfaces import Environment, Reward
from specagent.core.protocol import Episode, EpisodeRunner, run_episode
from specagent.core.types import Message, ToolCall, ToolSpec
from specagent.engines import EnginePool
from specagent.runtime.assembly import build_env, build_models, protocol_config
from specagent.runtime.episodes import episode_record
from specagent.serve.metrics import ServiceMetrics


class UnknownTask(SpecAgentError):
    """A request named a task the environment does not have (404)."""


class UnknownConversation(SpecAgentError):
    """A request named a conversation the server does not hold (404): never started, expired, or closed."""


class HistoryMismatch(SpecAgentError):
    """A continuation whose history is not the server's record plus new user messages (409)."""


class BadHistory(SpecAgentError):
    """A new conversation whose history carries tool calls or tool results (400)."""


class ModeNotAllowed(SpecAgentError):
    """A mode this server does not offer (403)."""


class ClientIsUser:
    """The environment with the HTTP client as its user: the agent's message to the user
    ends the turn instead of drawing a scripted answer."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.name = env.name

    def tool_specs(self) -> list[ToolSpec]:
        return self.env.tool_specs()

    def task_ids(self) -> list[str]:
        return self.env.task_ids()

    def reset(self, task_id: str) -> list[Message]:
        return self.env.reset(task_id)

    def execute(self, call: ToolCall) -> str:
        return self.env.execute(call)

    def is_terminal(self, call: ToolCall) -> bool:
        return self.env.is_terminal(call)

    def user_turn(self, reply: str) -> None:
        return None

    def reward(self, messages: Sequence[Message]) -> Reward:
        return self.env.reward(messages)

    def state_hash(self) -> str:
        return self.env.state_hash()


@dataclass
class Conversation:
    """A chat the server holds: its environment (the state its approved calls left) and its
    record, the messages as the client must send them back."""

    id: str
    task_id: str
    env: Environment
    record: list[Message]  # what the client sent plus everything the server added
    leading_system: list[Message] = field(default_factory=list)  # the policy, when the client sent none


@dataclass(frozen=True)
class ChatTurn:
    """One chat turn: the protocol's episode from the client's conversation, and what it added."""

    episode: Episode
    new_messages: list[Message]
    read_only: dict[str, bool]
    conversation_id: str = ""

    @property
    def reply(self) -> Message:
        """The agent's last message: its reply to the user (or the step the turn stopped at)."""
        return next((m for m in reversed(self.new_messages) if m.role == "assistant"), Message("assistant", ""))

    def executed_calls(self) -> list[dict[str, Any]]:
        """The tool calls the turn committed and ran server-side, with their observations."""
        observations = {m.tool_call_id: m.content for m in self.new_messages if m.role == "tool"}
        return [{"name": call.name, "arguments": call.arguments, "read_only": self.read_only.get(call.name, False),
                 "observation": observations.get(call.id)}
                for m in self.new_messages for call in m.tool_calls]


def _wire(message: Message) -> tuple:
    """A message as compared with the record: role, text, canonical calls, call id."""
    calls = tuple((c.id, canonical_call(c.name, c.arguments)) for c in message.tool_calls)
    return message.role, message.content or "", calls, message.tool_call_id


class Service:
    """Engines built once; episodes and chat turns run one at a time (a lock around the engines)."""

    def __init__(self, cfg: ServeConfig, env_factory: Callable[[], Environment] | None = None) -> None:
        self.cfg = cfg
        self.env_factory = env_factory or (lambda: build_env(cfg.env))
        self.env = self.env_factory()
        self.protocol = protocol_config(cfg.protocol, cfg.env)
        self.pool = EnginePool()
        try:
            modes = tuple({*cfg.modes, "specagent"})  # chat turns always run the protocol
            self.models = build_models(cfg, self.env, self.pool, modes)
        except BaseException:
            self.pool.close()
            raise
        self.model_names = {"strong": self.models.strong.model_name, "weak": self.models.weak.model_name}
        self.metrics = ServiceMetrics()
        self.conversations: OrderedDict[str, Conversation] = OrderedDict()
        self._lock = threading.Lock()

    def close(self) -> None:
        for conversation in self.conversations.values():
            conversation.env.close()
        self.conversations.clear()
        self.env.close()
        self.pool.close()

    def run_episode(self, task_id: str, mode: str = "specagent") -> dict[str, Any]:
        """One episode of ``task_id`` from a fresh environment; its episodes.jsonl record."""
        if mode not in self.cfg.modes:
            raise ModeNotAllowed(f"mode {mode!r} is not offered by this server (modes: {', '.join(self.cfg.modes)})")
        self._check_task(task_id)
        with self._lock:
            ep = run_episode(self.env, task_id, mode, self.models, self.protocol)
            if ep.tools_still_running:  # a late effect must not reach the next episode
                self.env.close()
                self.env = self.env_factory()
        self.metrics.add(ep, chat=False)
        return episode_record(ep, trial=0, models=self.model_names)

    def chat(self, messages: Sequence[Message], task_id: str | None = None,
             conversation_id: str | None = None) -> ChatTurn:
        """Continue a conversation until the agent's next message to the user.

        Without ``conversation_id`` a new conversation starts from ``task_id``'s fresh state
        (default: the first task); its history may hold system, user and assistant text,
        never tool calls. With it, ``messages`` must be the conversation's record followed
        by new user message(s)."""
        if "specagent" not in self.cfg.modes:
            raise ModeNotAllowed("chat turns run mode 'specagent', which this server does not offer")
        with self._lock:
            if conversation_id is None:
                conversation = self._start(messages, task_id)
                new = list(messages)
            else:
                conversation = self._continuation(conversation_id, messages, task_id)
                new = list(messages[len(conversation.record):])
            context = [*conversation.leading_system, *conversation.record, *new]
            # max_steps bounds this turn, not the conversation so far
            so_far = sum(m.role == "assistant" for m in context)
            config = replace(self.protocol, max_steps=self.protocol.max_steps + so_far)
            runner = EpisodeRunner(ClientIsUser(conversation.env), conversation.task_id, "specagent",
                                   self.models, config)
            ep = runner.run(start_from=context)
            added = ep.messages[len(context):]
            conversation.record = [*messages, *added] if conversation_id is None else [*conversation.record, *new, *added]
            if ep.tools_still_running:  # its state is unknown: the conversation cannot go on
                self._drop(conversation.id)
        self.metrics.add(ep, chat=True)
        return ChatTurn(ep, added, runner.read_only, conversation.id)

    # ------------------------------------------------------------------ conversations

    def _start(self, messages: Sequence[Message], task_id: str | None) -> Conversation:
        for number, message in enumerate(messages):
            if message.tool_calls or message.role == "tool":
                raise BadHistory(f"messages[{number}]: a new conversation's history cannot carry tool calls or "
                                 "results: the server runs only the calls it approves; continue a conversation "
                                 "with the conversation_id of its last reply")
        task_id = task_id or self.env.task_ids()[0]
        self._check_task(task_id)
        env = self.env_factory()
        opening = env.reset(task_id)
        system = [] if any(m.role == "system" for m in messages) else [m for m in opening if m.role == "system"]
        conversation = Conversation(f"conv-{uuid.uuid4().hex}", task_id, env, [], system)
        self.conversations[conversation.id] = conversation
        while len(self.conversations) > self.cfg.max_conversations:
            self._drop(next(iter(self.conversations)))
        return conversation

    def _continuation(self, conversation_id: str, messages: Sequence[Message], task_id: str | None) -> Conversation:
        conversation = self.conversations.get(conversation_id)
        if conversation is None:
            raise UnknownConversation(f"unknown conversation {conversation_id!r}: never started here, expired "
                                      f"(the server keeps {self.cfg.max_conversations}), or closed")
        if task_id is not None and task_id != conversation.task_id:
            raise HistoryMismatch(f"conversation {conversation_id!r} is about task {conversation.task_id!r}, "
                                  f"not {task_id!r}")
        record = conversation.record
        for number, (sent, kept) in enumerate(zip(messages, record)):
            if _wire(sent) != _wire(kept):
                raise HistoryMismatch(f"messages[{number}] differs from the server's record of conversation "
                                      f"{conversation_id!r}; send back the history as returned, then new user "
                                      "message(s)")
        new = messages[len(record):]
        if len(messages) < len(record) or not new:
            raise HistoryMismatch(f"messages must be the {len(record)} message(s) of conversation "
                                  f"{conversation_id!r} followed by at least one new user message")
        if any(m.role != "user" or m.tool_calls for m in new):
            raise HistoryMismatch("only user messages may follow the server's record of a conversation")
        self.conversations.move_to_end(conversation_id)
        return conversation

    def _drop(self, conversation_id: str) -> None:
        conversation = self.conversations.pop(conversation_id, None)
        if conversation is not None:
            conversation.env.close()

    def _check_task(self, task_id: str) -> None:
        if task_id not in self.env.task_ids():
            raise UnknownTask(f"unknown task {task_id!r} in environment {self.env.name!r}")


def chat_completion(turn: ChatTurn, model: str) -> dict[str, Any]:
    """A standard chat.completion object for a turn, with the protocol's account under `specagent`."""
    ep = turn.episode
    counts, total = ep.counts(), ep.ledger.total()
    stopped_short = ep.stop_reason.startswith(("max_steps", "context_length", "tool_timeout"))
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": turn.reply.content or ""},
                     "finish_reason": "length" if stopped_short else "stop"}],
        "usage": {"prompt_tokens": total.prompt_tokens, "completion_tokens": total.decode_tokens,
                  "total_tokens": total.prompt_tokens + total.decode_tokens},
        "specagent": {
            "conversation_id": turn.conversation_id,  # send it with the next turn
            **{key: counts[key] for key in ("rounds", "drafted_steps", "accepted_steps", "held_approved", "repairs",
                                            "invalid_verdicts")},
            "stop_reason": ep.stop_reason,
            "tool_calls": turn.executed_calls(),
            "steps": [step.to_json() for step in ep.steps],
            "messages": [m.to_openai() for m in turn.new_messages],  # append them to the history you send back
            "ledger": ep.ledger.to_json(),
            "network": ep.ledger.network_json(),
        },
    }
