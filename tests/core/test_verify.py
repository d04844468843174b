"""The verify prompt and the verdict parser."""

from __future__ import annotations

import pytest

from specagent.core.types import DraftedStep, Message, StepKind, ToolCall
from specagent.core.verify import HELD_OBSERVATION, parse_verdict, verify_messages


@pytest.mark.parametrize("text,expected", [
    ("2", 2), (" 2.", 2), ("Answer: 1", 1), ("verdict=0", 0), ("all", 3), ("none", 0),
    ("7", None), ("-1", None), ("Accept all", None), ("reject", None),  # out of range or not a stated count
    ("The last 1 assistant step is a", None), ("I think 2", None), ("", None), ("<tool_call>", None),
])
def test_verdict_is_a_bare_count_or_all_or_none(text, expected):
    assert parse_verdict(text, 3) == expected


def test_repair_prompt_is_a_prefix_of_the_verify_prompt_and_held_calls_are_answered():
    context = [Message("system", "policy"), Message("user", "hi")]
    read = Message("assistant", tool_calls=(ToolCall("c1", "get", {"id": 1}),))
    obs = Message("tool", "{}", tool_call_id="c1")
    held = Message("assistant", tool_calls=(ToolCall("c2", "set", {"id": 1}),))
    steps = [DraftedStep(read, StepKind.READ, (obs,)), DraftedStep(held, StepKind.WRITE)]
    prompt = verify_messages(context, steps)
    assert prompt[: len(context) + 2] == [*context, read, obs]  # the repair context after accepting step 1
    assert prompt[4] == held and prompt[5] == Message("tool", HELD_OBSERVATION, tool_call_id="c2", name="set")
    assert prompt[-1].role == "user" and "from 0 to 2" in prompt[-1].content
