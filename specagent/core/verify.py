"""The verify prompt, the verdict parser and the generative verifier.

The verify prompt is the committed context followed by the drafted steps rendered as
the strong model's own turns (calls, then their real observations), then one short
review request. The repair prompt for any rejected step is the committed context plus
the accepted prefix, which is a prefix of this message list: an engine with a prefix
cache reuses the verify prefill for the repair.
"""

from __future__ import annotations

import re
from typing import Sequence

from specagent.core.interfaces import ChatEngine, ChatRequest
from specagent.core.types import DraftedStep, Message, Segment, ToolSpec, Usage, Verdict

HELD_OBSERVATION = "(not executed: held for review)"


def review_request(k: int) -> str:
    return (
        f"REVIEW. The last {k} assistant step(s) above are proposals. Count how many of them, "
        f"from the first, a careful agent following the policy would take as they are; stop at "
        f"the first wrong one. Answer with one number from 0 to {k} and nothing else."
    )


def render_steps(steps: Sequence[DraftedStep]) -> list[Message]:
    """Drafted steps as conversation turns. A held call gets a placeholder observation so
    the list stays valid OpenAI chat (every tool call answered)."""
    out: list[Message] = []
    for step in steps:
        out.append(step.message)
        if step.observations:
            out.extend(step.observations)
        else:
            out.extend(
                Message(role="tool", content=HELD_OBSERVATION, tool_call_id=call.id, name=call.name)
                for call in step.message.tool_calls
            )
    return out


def verify_messages(context: Sequence[Message], steps: Sequence[DraftedStep]) -> list[Message]:
    """The one verify prompt, used by the runtime, by mining and by verdict training."""
    return [*context, *render_steps(steps), Message(role="user", content=review_request(len(steps)))]


# The verdict is a number at the very start of the reply ("2", "2.", "Answer: 2"). A number
# further in is not a verdict: a model that echoes the question ("The last 3 steps ...")
# must not be read as approving three steps.
_VERDICT = re.compile(r"^\s*(?:(?:answer|verdict|accepted)\s*[:=]?\s*)?(-?\d+)\b")


def parse_verdict(text: str, k: int) -> int | None:
    """The accepted-prefix length in a verdict reply, clamped to 0..k; None if unparseable."""
    cleaned = (text or "").strip().lower()
    match = _VERDICT.match(cleaned)
    if match:
        return min(max(int(match.group(1)), 0), k)
    if cleaned.startswith(("all", "accept")):
        return k
    if cleaned.startswith(("none", "reject")):
        return 0
    return None


class GenerativeVerifier:
    """The strong model reads the verify prompt in one prefill and decodes a short number."""

    def __init__(self, engine: ChatEngine, adapter: str | None = None, max_tokens: int = 8) -> None:
        self.engine = engine
        self.adapter = adapter
        self.max_tokens = max_tokens

    def verify(
        self, context: Sequence[Message], tools: Sequence[ToolSpec], segment: Segment
    ) -> tuple[Verdict, list[tuple[str, Usage]]]:
        steps = segment.verifiable
        request = ChatRequest(verify_messages(context, steps), tools, self.max_tokens, self.adapter)
        completion = self.engine.chat([request])[0]
        # A tool call is not a verdict: treat it as unparseable.
        accepted = None if completion.message.tool_calls else parse_verdict(completion.text, len(steps))
        # Unparseable means reject everything: the strong model repairs the first step.
        return Verdict(accepted=accepted or 0, raw=completion.text), [("strong", completion.usage)]
