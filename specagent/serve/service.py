"""The runtime behind `specagent serve`: one environment, the engines, one request at a time.

An episode runs a task from a fresh environment, as `specagent run` does. A chat turn
continues a client's conversation: the environment is reset, the tool calls already in the
conversation are replayed so that its state matches what the conversation says happened,
and the SpecAgent protocol runs until the agent's next message to the user, who is the
client. Tools run server-side under the protocol's rules: read-only steps are executed as
drafted, a state-changing step is held until the strong model approves it.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Sequence

from specagent.config import RunConfig, ServeConfig
from specagent.core.canonical import same_step
from specagent.core.errors import ConfigError, SpecAgentError
from specagent.core.interfaces import Environment, Reward
from specagent.core.protocol import MODES, Episode, EpisodeRunner, run_episode
from specagent.core.types import DraftedStep, Message, ToolCall, ToolSpec
from specagent.core.verify import render_steps
from specagent.engines import EnginePool
from specagent.engines.scripted import ScriptedVerifier
from specagent.eval.episodes import episode_record
from specagent.serve.metrics import ServiceMetrics
from specagent.serve.runtime import build_env, build_models, protocol_config


class UnknownTask(SpecAgentError):
    """A request named a task the environment does not have."""


def run_config(cfg: ServeConfig) -> RunConfig:
    """The serve config as the run config that the shared runtime builders take."""
    return RunConfig(env=cfg.env, strong=cfg.strong, weak=cfg.weak, drafter_adapter=cfg.drafter_adapter,
                     verifier=cfg.verifier, protocol=cfg.protocol)


def expert_verifier(env: Environment) -> ScriptedVerifier:
    """`verifier.kind: scripted` (tests): approves the longest drafted prefix that the
    environment's expert would take, step for step."""
    if not hasattr(env, "task"):
        raise ConfigError(f"verifier.kind scripted needs an environment with an expert; {env.name!r} has none")
    from specagent.envs.store.expert import expert_policy

    policy = expert_policy(env)

    def judge(context: Sequence[Message], steps: Sequence[DraftedStep]) -> int:
        history = list(context)
        for accepted, step in enumerate(steps):
            if not same_step(policy(history, ()), step.message):
                return accepted
            history += render_steps([step])
        return len(steps)

    return ScriptedVerifier(judge)


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


@dataclass(frozen=True)
class ChatTurn:
    """One chat turn: the protocol's episode from the client's conversation, and what it added."""

    episode: Episode
    new_messages: list[Message]
    read_only: dict[str, bool]

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


class Service:
    """Engines built once; episodes and chat turns run one at a time (a lock around the engines)."""

    def __init__(self, cfg: ServeConfig) -> None:
        run = run_config(cfg)
        self.env = build_env(cfg.env)
        self.protocol = protocol_config(run)
        self.pool = EnginePool()
        try:
            self.models = build_models(run, self.env, self.pool, MODES)
            if cfg.verifier.kind == "scripted":
                self.models = replace(self.models, verifier=expert_verifier(self.env))
        except BaseException:
            self.pool.close()
            raise
        self.model_names = {"strong": self.models.strong.model_name, "weak": self.models.weak.model_name}
        self.metrics = ServiceMetrics()
        self._lock = threading.Lock()

    def close(self) -> None:
        self.pool.close()

    def run_episode(self, task_id: str, mode: str = "specagent") -> dict[str, Any]:
        """One episode of ``task_id`` from a fresh environment; its episodes.jsonl record."""
        self._check_task(task_id)
        with self._lock:
            ep = run_episode(self.env, task_id, mode, self.models, self.protocol)
        self.metrics.add(ep, chat=False)
        return episode_record(ep, trial=0, models=self.model_names)

    def chat(self, messages: Sequence[Message], task_id: str | None = None) -> ChatTurn:
        """Continue ``messages`` until the agent's next message to the user. The environment
        starts from ``task_id``'s fresh state (default: its first task); without a system
        message in ``messages``, the environment's policy leads the conversation."""
        task_id = task_id or self.env.task_ids()[0]
        self._check_task(task_id)
        with self._lock:
            opening = self.env.reset(task_id)
            if not any(m.role == "system" for m in messages):
                messages = [*(m for m in opening if m.role == "system"), *messages]
            for call in (call for m in messages for call in m.tool_calls):
                self.env.execute(call)
            # max_steps bounds this turn, not the conversation so far
            so_far = sum(m.role == "assistant" for m in messages)
            config = replace(self.protocol, max_steps=self.protocol.max_steps + so_far)
            runner = EpisodeRunner(ClientIsUser(self.env), task_id, "specagent", self.models, config)
            ep = runner.run(start_from=messages)
        self.metrics.add(ep, chat=True)
        return ChatTurn(ep, ep.messages[len(messages):], runner.read_only)

    def _check_task(self, task_id: str) -> None:
        if task_id not in self.env.task_ids():
            raise UnknownTask(f"unknown task {task_id!r} in environment {self.env.name!r}")


def chat_completion(turn: ChatTurn, model: str) -> dict[str, Any]:
    """A standard chat.completion object for a turn, with the protocol's account under `specagent`."""
    ep = turn.episode
    counts, total = ep.counts(), ep.ledger.total()
    stopped_short = ep.stop_reason.startswith(("max_steps", "context_length"))
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
            **{key: counts[key] for key in ("rounds", "drafted_steps", "accepted_steps", "held_approved", "repairs")},
            "stop_reason": ep.stop_reason,
            "tool_calls": turn.executed_calls(),
            "steps": [step.to_json() for step in ep.steps],
            "messages": [m.to_openai() for m in turn.new_messages],  # send them back to continue
            "ledger": ep.ledger.to_json(),
            "network": ep.ledger.network_json(),
        },
    }
