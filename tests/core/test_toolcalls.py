"""Parsing raw model text into tool calls: valid, lenient, malformed, and never an exception."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.toolcalls import parse_assistant_text, validate_arguments, validate_message
from specagent.core.types import Message, ToolCall, ToolSpec

GET_ORDER = ToolSpec(
    name="get_order",
    description="Look up an order.",
    parameters={
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
        "additionalProperties": False,
    },
    read_only=True,
)
CANCEL = ToolSpec(
    name="cancel_order",
    description="Cancel an order.",
    parameters={
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "reason": {"enum": ["mistake", "unneeded"]}},
        "required": ["order_id", "reason"],
    },
)
TOOLS = (GET_ORDER, CANCEL)


def block(obj: object) -> str:
    return f"<tool_call>\n{json.dumps(obj)}\n</tool_call>"


def test_single_call_with_leading_text():
    text = "Let me look.\n" + block({"name": "get_order", "arguments": {"order_id": "#W1"}})
    message, malformed = parse_assistant_text(text, TOOLS)
    assert malformed is None
    assert message == Message(
        role="assistant",
        content="Let me look.",
        tool_calls=(ToolCall(id="call_0", name="get_order", arguments={"order_id": "#W1"}),),
    )


def test_multiple_calls_get_sequential_ids_and_no_content():
    text = (
        block({"name": "get_order", "arguments": {"order_id": "#W1"}})
        + "\n"
        + block({"name": "cancel_order", "arguments": {"order_id": "#W2", "reason": "mistake"}})
    )
    message, malformed = parse_assistant_text(text, TOOLS)
    assert malformed is None
    assert message.content is None
    assert [(c.id, c.name) for c in message.tool_calls] == [("call_0", "get_order"), ("call_1", "cancel_order")]
    assert message.tool_calls[1].arguments == {"order_id": "#W2", "reason": "mistake"}


def test_bare_json_reply_is_a_call():
    message, malformed = parse_assistant_text(' {"name": "get_order", "arguments": {"order_id": "7"}} ', TOOLS)
    assert malformed is None
    assert message.tool_calls == (ToolCall("call_0", "get_order", {"order_id": "7"}),)
    assert message.content is None


def test_parameters_synonym_and_string_arguments():
    text = block({"name": "get_order", "parameters": {"order_id": "1"}}) + block(
        {"name": "get_order", "arguments": json.dumps({"order_id": "2"})}
    )
    message, malformed = parse_assistant_text(text, TOOLS)
    assert malformed is None
    assert [c.arguments for c in message.tool_calls] == [{"order_id": "1"}, {"order_id": "2"}]


def test_fenced_bare_json_is_a_call():
    text = '```json\n{"name": "get_order", "arguments": {"order_id": "7"}}\n```'
    message, malformed = parse_assistant_text(text, TOOLS)
    assert malformed is None and message.tool_calls[0].name == "get_order"


def test_plain_text_is_a_reply_not_malformed():
    message, malformed = parse_assistant_text("  Your order has shipped.\n", TOOLS)
    assert malformed is None
    assert message == Message(role="assistant", content="Your order has shipped.")


def test_json_that_is_not_a_call_is_a_reply():
    message, malformed = parse_assistant_text('{"status": "ok"}', TOOLS)
    assert malformed is None and message.content == '{"status": "ok"}' and not message.tool_calls


def assert_malformed(text: str, fragment: str) -> None:
    message, malformed = parse_assistant_text(text, TOOLS)
    assert malformed is not None and fragment in malformed, malformed
    assert message.tool_calls == ()
    assert message.content == text


def test_bad_json_is_malformed():
    assert_malformed('<tool_call>\n{"name": "get_order", "arguments": {"order_id": }\n</tool_call>', "not valid JSON")


def test_unterminated_call_is_malformed():
    assert_malformed('<tool_call>\n{"name": "get_order", "arguments": {"order_id": "1"}}', "unterminated")


def test_stray_close_tag_is_malformed():
    assert_malformed("Done.</tool_call>", "without <tool_call>")


def test_unknown_tool_is_malformed():
    assert_malformed(block({"name": "delete_everything", "arguments": {}}), "unknown tool 'delete_everything'")


def test_bare_json_with_unknown_tool_is_malformed():
    assert_malformed('{"name": "nope", "arguments": {}}', "unknown tool")


def test_arguments_not_an_object_are_malformed():
    assert_malformed(block({"name": "get_order", "arguments": ["1"]}), "must be a JSON object, got array")
    assert_malformed(block({"name": "get_order", "arguments": "[1]"}), "must be a JSON object, got array")


def test_schema_failures_are_malformed():
    assert_malformed(block({"name": "get_order", "arguments": {}}), "'order_id' is a required property")
    assert_malformed(block({"name": "get_order", "arguments": {"order_id": 5}}), "at order_id")
    assert_malformed(block({"name": "cancel_order", "arguments": {"order_id": "1", "reason": "x"}}), "reason")


def test_one_bad_call_spoils_the_step():
    text = block({"name": "get_order", "arguments": {"order_id": "1"}}) + block({"name": "x", "arguments": {}})
    assert_malformed(text, "unknown tool 'x'")


def test_validate_arguments_and_message():
    assert validate_arguments(GET_ORDER, {"order_id": "1"}) is None
    assert "additional" in validate_arguments(GET_ORDER, {"order_id": "1", "extra": 1}).lower()
    assert "must be a JSON object" in validate_arguments(GET_ORDER, "x")
    broken = ToolSpec("broken", "", {"type": "no-such-type"})
    assert "invalid parameters schema" in validate_arguments(broken, {})
    good = Message("assistant", tool_calls=(ToolCall("a", "get_order", {"order_id": "1"}),))
    assert validate_message(good, TOOLS) is None
    unknown = Message("assistant", tool_calls=(ToolCall("a", "nope", {}),))
    assert "unknown tool 'nope'" in validate_message(unknown, TOOLS)
    invalid = Message("assistant", tool_calls=(ToolCall("a", "cancel_order", {"order_id": "1"}),))
    assert "required" in validate_message(invalid, TOOLS)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
call_like = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["get_order", "cancel_order", "other"]) | json_values,
        "arguments": json_values | json_values.map(json.dumps),
        "parameters": json_values,
        "function": json_values,
    },
)
fragments = st.sampled_from(["<tool_call>", "</tool_call>", "\n", "```", "{", "}", '"name"', "```json"])
texts = st.one_of(
    st.text(),
    json_values.map(json.dumps),
    call_like.map(json.dumps),
    st.lists(st.one_of(st.text(max_size=15), fragments, call_like.map(json.dumps)), max_size=8).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(texts)
def test_parse_never_raises(text):
    message, malformed = parse_assistant_text(text, TOOLS)
    assert message.role == "assistant"
    if malformed is not None:
        assert message.tool_calls == () and message.content == (text or None)
    for i, call in enumerate(message.tool_calls):
        assert call.id == f"call_{i}"
        assert validate_message(Message("assistant", tool_calls=(call,)), TOOLS) is None


def test_parsing_imports_no_torch():
    code = "import sys, specagent.core.toolcalls; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
