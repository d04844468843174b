"""Canonical spellings of tool calls, so that equivalent calls compare equal.

Used by the `stepwise` baseline, the `match` labeler and the replay environment.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from specagent.core.types import Message


def canonical_value(value: Any) -> Any:
    """Normalise a JSON value: integral floats become ints, floats are rounded, keys sorted."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else round(value, 6)
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {str(k): canonical_value(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [canonical_value(v) for v in value]
    return value


def canonical_call(name: str, arguments: dict[str, Any]) -> str:
    """One string per equivalent call: name plus arguments in canonical JSON."""
    args = json.dumps(canonical_value(arguments), sort_keys=True, separators=(",", ":"))
    return f"{name}({args})"


def normalise_text(text: str | None) -> str:
    return re.sub(r"\s+", " ", (text or "").strip().lower())


def same_step(a: Message, b: Message) -> bool:
    """True if two assistant steps do the same thing: the same multiset of canonical calls,
    or (for replies to the user) the same text up to case and whitespace."""
    if a.tool_calls or b.tool_calls:
        calls_a = Counter(canonical_call(c.name, c.arguments) for c in a.tool_calls)
        calls_b = Counter(canonical_call(c.name, c.arguments) for c in b.tool_calls)
        return calls_a == calls_b
    return normalise_text(a.content) == normalise_text(b.content)
