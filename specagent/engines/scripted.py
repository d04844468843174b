"""Deterministic fake models for protocol tests and benchmarks (never for results).

A policy maps the conversation to the next assistant message (or verdict text). Token
counts are a fixed function of the text (4 characters a token) so that accounting can
be checked exactly; an optional latency per token makes the fake as slow as a real
model for overhead benchmarks, and one per call (whatever the batch size, as a
memory-bound forward pass) makes batching pay off as it does on a real engine.
"""

from __future__ import annotations

import json
import time
from typing import Callable, Sequence, Union

from specagent.core.interfaces import ChatRequest, Completion, ModelCost
from specagent.core.types import Message, ToolSpec, Usage

PolicyOutput = Union[Message, str, tuple[Message, str]]  # message | verdict text | (message, malformed)
Policy = Callable[[Sequence[Message], Sequence[ToolSpec]], PolicyOutput]


def count_tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def message_text(message: Message) -> str:
    calls = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    return (message.content or "") + (json.dumps(calls, sort_keys=True) if calls else "")


class ScriptedEngine:
    """A ChatEngine whose replies come from a Python function."""

    def __init__(
        self,
        policy: Policy,
        model_name: str = "scripted",
        cost: ModelCost = ModelCost(weight_bytes=1_000_000, kv_bytes_per_token=1_000),
        prefill_s_per_token: float = 0.0,
        decode_s_per_token: float = 0.0,
        latency_s: float = 0.0,
    ) -> None:
        self.policy = policy
        self.model_name = model_name
        self.cost = cost
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_s_per_token = decode_s_per_token
        self.latency_s = latency_s
        self.calls = 0
        self.generated_tokens = 0

    def close(self) -> None:
        """Nothing to free."""

    def chat(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        if self.latency_s and requests:
            time.sleep(self.latency_s)  # one wait for the whole batch, shared by its requests
        share = self.latency_s / len(requests) if requests else 0.0
        return [self._one(request, share) for request in requests]

    def _one(self, request: ChatRequest, waited: float = 0.0) -> Completion:
        start = time.perf_counter()
        out = self.policy(request.messages, request.tools)
        malformed = None
        if isinstance(out, tuple):
            out, malformed = out
        message = out if isinstance(out, Message) else Message(role="assistant", content=out)
        text = message_text(message)
        prompt = count_tokens("".join(message_text(m) for m in request.messages))
        completion = min(count_tokens(text), request.max_tokens)
        delay = prompt * self.prefill_s_per_token + completion * self.decode_s_per_token
        if delay:
            time.sleep(delay)
        self.calls += 1
        self.generated_tokens += completion
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, seconds=time.perf_counter() - start + waited)
        return Completion(text=text, message=message, usage=usage, malformed=malformed)


class ScriptedVerifier:
    """A Verifier whose verdict is a Python function of (context, verifiable steps)."""

    def __init__(self, judge: Callable[[Sequence[Message], Sequence], int], prompt_tokens: int = 100) -> None:
        self.judge = judge
        self.prompt_tokens = prompt_tokens
        self.calls = 0

    def verify(self, context, tools, segment):
        from specagent.core.types import Verdict

        self.calls += 1
        accepted = self.judge(context, segment.verifiable)
        usage = Usage(prompt_tokens=self.prompt_tokens, completion_tokens=1)
        return Verdict(accepted=accepted, raw=str(accepted)), [("strong", usage)]
