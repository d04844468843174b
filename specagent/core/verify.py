"""The verify prompt, the verdict parser and the generative verifier.

The verify prompt is the committed context followed by the drafted steps rendered as
the strong model's own turns (calls, then their real observations), then one short
review request. The repair prompt for any rejected step is the committed context plus
the accepted prefix, which is a prefix of this message list: an engine with a prefix
cache reuses the verify prefill for the repair.
"""

from __future__ import annotations

import numbers
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


# A verdict grants a prefix only when the whole reply states one (DESIGN §1): a count alone
# ("2", "2.", "Answer: 2"), or the words "all" / "none" alone. Anything else — a count
# followed by more words, "all but one", "accept none", "not all", a number in words, a
# count outside 0..k — is unparseable, which the protocol treats as reject-all + repair.
# A model that echoes the question ("The last 3 steps ...") must never approve three steps.
_LABEL = re.compile(r"(?:answer|verdict|accepted)\s*[:=]?\s*")
_COUNT = re.compile(r"[0-9]{1,4}")
_WORDS = {"all": None, "none": 0}  # None: every step (k)


def parse_verdict(text: str | None, k: int) -> int | None:
    """The accepted-prefix length a verdict reply states unambiguously, or None."""
    cleaned = " ".join((text or "").lower().split()).removesuffix(".").strip()
    label = _LABEL.match(cleaned)
    stated = cleaned[label.end():] if label else cleaned
    if _COUNT.fullmatch(stated):
        return int(stated) if int(stated) <= k else None
    if stated in _WORDS:
        return k if _WORDS[stated] is None else _WORDS[stated]
    return None


def granted_prefix(verdict: object, k: int) -> tuple[int, str | None]:
    """(accepted prefix, why the verdict is invalid or None) for whatever a verifier returned.

    A verdict is a ``Verdict`` whose ``accepted`` is an integer in [0, k] (not a bool, not a
    fraction, not a string) and which the verifier did not itself mark invalid. Anything
    else grants 0: the protocol rejects every step and repairs the first one."""
    if not isinstance(verdict, Verdict):
        return 0, f"the verifier returned {type(verdict).__name__}, not a Verdict"
    if verdict.invalid:
        return 0, verdict.invalid
    accepted = verdict.accepted
    if isinstance(accepted, bool) or not isinstance(accepted, numbers.Integral):
        return 0, f"accepted={accepted!r} is not an integer"
    if not 0 <= accepted <= k:
        return 0, f"accepted={accepted} is outside 0..{k}"
    return int(accepted), None


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
        usage = [("strong", completion.usage)]
        if completion.message.tool_calls:  # a tool call is not a verdict
            return Verdict(accepted=0, raw=completion.text, invalid="a tool call instead of a verdict"), usage
        accepted = parse_verdict(completion.text, len(steps))
        if accepted is None:  # reject everything: the strong model repairs the first step
            return Verdict(accepted=0, raw=completion.text, invalid="no unambiguous count in the reply"), usage
        return Verdict(accepted=accepted, raw=completion.text), usage
