"""Read-only classification of tools (DESIGN §1).

Precedence: the user's explicit lists > the environment's declaration > write.
Unknown means unsafe, and a server's hint never beats the user's configuration.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from specagent.core.errors import ConfigError
from specagent.core.types import DraftedStep, Message, StepKind, ToolSpec


def classify_tools(
    specs: Sequence[ToolSpec], read_only: Iterable[str] = (), write: Iterable[str] = ()
) -> dict[str, bool]:
    """Map tool name -> True if read-only. Names in both user lists are an error."""
    allow, deny = set(read_only), set(write)
    both = sorted(allow & deny)
    if both:
        raise ConfigError(f"tools listed as both read_only and write: {', '.join(both)}")
    result: dict[str, bool] = {}
    for spec in specs:
        if spec.name in deny:
            result[spec.name] = False
        elif spec.name in allow:
            result[spec.name] = True
        else:
            result[spec.name] = spec.read_only is True
    return result


def step_kind(message: Message, read_only: dict[str, bool], malformed: str | None = None) -> StepKind:
    """What executing ``message`` would do. Tools missing from the map count as write."""
    if malformed is not None:
        return StepKind.MALFORMED
    if not message.tool_calls:
        return StepKind.REPLY if (message.content or "").strip() else StepKind.MALFORMED
    if all(read_only.get(call.name, False) for call in message.tool_calls):
        return StepKind.READ
    return StepKind.WRITE


def drafted(message: Message, read_only: dict[str, bool], malformed: str | None) -> DraftedStep:
    kind = step_kind(message, read_only, malformed)
    if kind is StepKind.MALFORMED and malformed is None:
        malformed = "empty step"
    return DraftedStep(message=message, kind=kind, malformed=malformed)
