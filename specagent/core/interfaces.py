"""The small interfaces the protocol talks to: environments, chat engines, verifiers.

Engines and environments live in their own packages and satisfy these protocols
structurally; the core never imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from specagent.core.types import Message, Segment, ToolCall, ToolSpec, Usage, Verdict


@dataclass(frozen=True)
class ModelCost:
    """Bytes a forward pass reads: the weights once, plus the KV cache of the context.

    Used for the memory-traffic estimate of DESIGN §3. ``prefill_chunk`` is the number
    of prompt tokens one prefill pass processes (engines prefill long prompts in chunks).
    ``adapter_bytes``: the extra weight bytes a pass through each LoRA adapter reads.
    ``dtype``: the element type the engine runs the weights in (what the bytes count).
    """

    weight_bytes: int
    kv_bytes_per_token: int
    prefill_chunk: int = 8192
    adapter_bytes: Mapping[str, int] = field(default_factory=dict)
    dtype: str = ""  # the weights' dtype as the engine runs them (e.g. "bfloat16" on vLLM CPU)

    def for_adapter(self, adapter: str | None) -> "ModelCost":
        """The cost of a pass through ``adapter`` (None: the base weights)."""
        extra = self.adapter_bytes.get(adapter, 0) if adapter else 0
        return replace(self, weight_bytes=self.weight_bytes + extra) if extra else self


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion request: OpenAI messages, the tools to offer, a token budget."""

    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    max_tokens: int = 256
    adapter: str | None = None  # a LoRA adapter name/path the engine knows, None = base weights
    # Assistant text the reply starts with: rendered after the assistant header, decoding goes
    # on from its end, the completion's text begins with it and only the new tokens count as
    # decoded. An engine that cannot continue a message decodes the whole step instead; one that
    # can says so with a class attribute `continues_messages = True` (transformers, vLLM).
    continuation: str = ""
    # The drafter's own confidence as a stop rule: decoding ends at the first position whose most
    # likely token has a probability below this, before writing that token; the completion's
    # text is what came before and its finish_reason "unsure" (its usage counts the pass that
    # found it). 0: never. An engine that honours it says so with `stops_unsure = True`.
    stop_below: float = 0.0


@dataclass(frozen=True)
class Completion:
    """An engine's answer: the raw text, the parsed assistant message and the cost.

    ``malformed`` is set (and ``message`` holds no tool calls) when the text tried to
    call a tool but could not be parsed or validated; it is never an exception.
    """

    text: str
    message: Message
    usage: Usage
    malformed: str | None = None
    finish_reason: str = "stop"


@dataclass(frozen=True)
class ScoreRequest:
    """Read the next-token log-probabilities of ``candidates`` at ``positions`` of a prompt
    given as token ids, in one prefill (a verdict head: no token is decoded).

    ``own``: instead of fixed candidates, the prompt's own next token at each position
    (``token_ids[position + 1]``): how likely the model finds a text it did not write (a
    likelihood verdict). Each position's list is then ``[logprob, is_top]``, ``is_top`` 1.0
    when that token is the model's most likely one there (its greedy choice), else 0.0."""

    token_ids: Sequence[int]
    positions: Sequence[int]
    candidates: Sequence[int] = ()
    adapter: str | None = None
    own: bool = False


@dataclass(frozen=True)
class Scores:
    """Per position, the log-probability of each candidate token; and what the prefill cost."""

    logprobs: list[list[float]]
    usage: Usage
    estimated: int = 0  # candidates outside the engine's reported top-k: their log-prob is an upper bound


@runtime_checkable
class TokenScorer(Protocol):
    """An engine that can score prompt positions (transformers, vLLM via prompt_logprobs)."""

    model_name: str
    tokenizer: Any

    def score(self, requests: Sequence[ScoreRequest]) -> list[Scores]: ...

    def profile_for(self, adapter: str | None) -> Any:
        """The prompt profile (``engines.render.PromptProfile``) prompts on ``adapter`` are rendered with."""
        ...


@runtime_checkable
class ChatEngine(Protocol):
    """A model behind chat-with-tools. Batched: one call may carry many requests."""

    model_name: str
    cost: ModelCost

    def chat(self, requests: Sequence[ChatRequest]) -> list[Completion]: ...

    def close(self) -> None:
        """Free what the engine holds (processes, memory); a closed engine answers no more."""
        ...


@dataclass(frozen=True)
class Reward:
    reward: float
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """A tool domain with tasks. One episode at a time: ``reset`` starts a fresh state."""

    name: str

    def tool_specs(self) -> list[ToolSpec]: ...

    def task_ids(self) -> list[str]: ...

    def reset(self, task_id: str) -> list[Message]:
        """Fresh state for the task; returns the opening messages (system policy + user request)."""
        ...

    def execute(self, call: ToolCall) -> str:
        """Run one tool call. Errors (bad ids, policy violations) come back as text starting
        with "Error" (`classify.failed_call`)."""
        ...

    def is_terminal(self, call: ToolCall) -> bool:
        """True for calls that end the conversation (e.g. a transfer to a human)."""
        ...

    def user_turn(self, reply: str) -> str | None:
        """The user's answer to an agent message, or None when the conversation is over."""
        ...

    def reward(self, messages: Sequence[Message]) -> Reward: ...

    def state_hash(self) -> str:
        """Canonical hash of the current state (database)."""
        ...

    def close(self) -> None:
        """End the environment's sessions and processes (MCP servers); a no-op for most."""
        ...


Policy = Callable[[Sequence[Message], Sequence[ToolSpec]], Message]


@runtime_checkable
class HasExpert(Protocol):
    """An environment with a scripted expert: the reference agent of each of its tasks,
    played by the `scripted` backend and the `scripted` (expert) verifier in tests."""

    def expert(self) -> Policy:
        """A model function: the expert's next message for a conversation of one of its tasks."""
        ...


@runtime_checkable
class Verifier(Protocol):
    """Judges a drafted segment in one prefill and says how long its valid prefix is."""

    def verify(
        self, context: Sequence[Message], tools: Sequence[ToolSpec], segment: Segment
    ) -> tuple[Verdict, list[tuple[str, Usage]]]:
        """Returns the verdict and the usage of each model call it made, as (model, usage)."""
        ...
