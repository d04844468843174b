"""Turning a model's raw text into an assistant message with tool calls, or a reason it can't be.

Models call tools hermes-style, as specagent's chat template teaches them:

    <tool_call>
    {"name": "get_order", "arguments": {"order_id": "#W1"}}
    </tool_call>

A step that tries to call a tool and fails (bad JSON, unknown tool, arguments that do
not fit the schema) is *malformed*: the protocol never executes it (DESIGN §1). A
malformed step is a value, never an exception: `parse_assistant_text` does not raise.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

import jsonschema
from jsonschema.exceptions import SchemaError

from specagent.core.types import Message, ToolCall, ToolSpec

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class _Malformed(Exception):
    """Internal: why a tool-call attempt cannot be executed."""


def parse_assistant_text(text: str, tools: Sequence[ToolSpec]) -> tuple[Message, str | None]:
    """The assistant message `text` encodes, and None; or a plain-text message and the reason
    the text's tool-call attempt is malformed.

    Calls are numbered "call_0", "call_1", ... (the protocol assigns the real ids).
    Lenient where the model is clearly calling a tool: a bare JSON object
    ``{"name": ..., "arguments": ...}`` as the whole reply, ``"parameters"`` for
    ``"arguments"``, and arguments given as a JSON string are all accepted.
    """
    if not isinstance(text, str):
        return Message(role="assistant", content=None), f"model output is {type(text).__name__}, not text"
    try:
        content, raw_calls = _split(text)
        calls = tuple(_tool_call(i, raw, tools) for i, raw in enumerate(raw_calls))
    except _Malformed as why:
        return Message(role="assistant", content=text or None), str(why)
    return Message(role="assistant", content=content, tool_calls=calls), None


def validate_arguments(spec: ToolSpec, arguments: Any) -> str | None:
    """Why `arguments` do not fit the tool's JSON schema, or None when they do."""
    if not isinstance(arguments, dict):
        return f"arguments of {spec.name} must be a JSON object, got {_json_type(arguments)}"
    schema = spec.parameters or {"type": "object"}
    try:
        validator_cls = jsonschema.validators.validator_for(schema)
        validator_cls.check_schema(schema)
        error = jsonschema.exceptions.best_match(validator_cls(schema).iter_errors(arguments))
    except SchemaError as exc:
        return f"tool {spec.name} has an invalid parameters schema: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - schemas come from outside (unresolvable $ref, deep nesting)
        return f"arguments of {spec.name} could not be validated: {type(exc).__name__}: {_short(exc)}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"arguments of {spec.name} fail its schema{f' at {where}' if where else ''}: {error.message}"


def validate_message(message: Message, tools: Sequence[ToolSpec]) -> str | None:
    """Why the structured tool calls of `message` (e.g. from an API) are malformed, or None."""
    by_name = {t.name: t for t in tools}
    for call in message.tool_calls:
        spec = by_name.get(call.name)
        if spec is None:
            return f"unknown tool {call.name!r} (known: {', '.join(sorted(by_name)) or 'none'})"
        problem = validate_arguments(spec, call.arguments)
        if problem:
            return problem
    return None


def _split(text: str) -> tuple[str | None, list[str]]:
    """(content outside tool-call blocks, the JSON text of each call attempt)."""
    if TOOL_CALL_OPEN not in text:
        if TOOL_CALL_CLOSE in text:
            raise _Malformed(f"{TOOL_CALL_CLOSE} without {TOOL_CALL_OPEN}")
        bare = _bare_call(text)
        if bare is not None:
            return None, [bare]
        return text.strip() or None, []
    outside, calls = [], []
    rest = text
    while TOOL_CALL_OPEN in rest:
        before, _, after = rest.partition(TOOL_CALL_OPEN)
        if TOOL_CALL_CLOSE in before:
            raise _Malformed(f"{TOOL_CALL_CLOSE} without {TOOL_CALL_OPEN}")
        if TOOL_CALL_CLOSE not in after:
            raise _Malformed(f"unterminated {TOOL_CALL_OPEN} (no {TOOL_CALL_CLOSE})")
        body, _, rest = after.partition(TOOL_CALL_CLOSE)
        outside.append(before)
        calls.append(body)
    if TOOL_CALL_CLOSE in rest:
        raise _Malformed(f"{TOOL_CALL_CLOSE} without {TOOL_CALL_OPEN}")
    outside.append(rest)
    content = "\n".join(part.strip() for part in outside if part.strip())
    return content or None, calls


def _bare_call(text: str) -> str | None:
    """The text itself when the whole reply is a JSON object that looks like a tool call."""
    stripped = _unfence(text.strip())
    if not stripped.startswith("{"):
        return None
    try:
        obj = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    if isinstance(obj, dict) and "name" in obj and ("arguments" in obj or "parameters" in obj):
        return stripped
    return None


def _tool_call(index: int, body: str, tools: Sequence[ToolSpec]) -> ToolCall:
    """One validated ToolCall from the JSON text of a call attempt."""
    try:
        obj = json.loads(_unfence(body.strip()))
    except (ValueError, RecursionError) as exc:
        raise _Malformed(f"tool call {index} is not valid JSON: {_short(exc)}") from None
    if not isinstance(obj, dict):
        raise _Malformed(f"tool call {index} must be a JSON object, got {_json_type(obj)}")
    if isinstance(obj.get("function"), dict) and "name" not in obj:  # OpenAI's nesting
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed(f"tool call {index} has no tool name")
    spec = next((t for t in tools if t.name == name), None)
    if spec is None:
        known = ", ".join(t.name for t in tools) or "none"
        raise _Malformed(f"unknown tool {name[:80]!r} (known: {known})")
    arguments = _arguments(name, obj.get("arguments", obj.get("parameters", {})))
    problem = validate_arguments(spec, arguments)
    if problem:
        raise _Malformed(problem)
    return ToolCall(id=f"call_{index}", name=name, arguments=arguments)


def _arguments(name: str, raw: Any) -> dict[str, Any]:
    """Arguments as a dict; a JSON string holding an object is decoded."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise _Malformed(f"arguments of {name} are a string that is not valid JSON: {_short(exc)}") from None
    if not isinstance(raw, dict):
        raise _Malformed(f"arguments of {name} must be a JSON object, got {_json_type(raw)}")
    return raw


def _unfence(text: str) -> str:
    """Text without a surrounding Markdown code fence (```json ... ```)."""
    match = _FENCE.match(text)
    return match.group(1) if match else text


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _short(exc: BaseException) -> str:
    return str(exc)[:200]
