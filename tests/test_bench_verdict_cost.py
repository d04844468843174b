"""bench/verdict_cost.py's repair prompt: the committed context after k accepted steps."""

from types import SimpleNamespace

from specagent.core.types import Message, ToolCall
from tests.helpers.bench import load_bench


def call(name: str, i: int) -> Message:
    return Message("assistant", None, tool_calls=(ToolCall(f"c{i}", name, {}),))


def test_the_repair_prompt_ends_after_each_accepted_step_and_its_recorded_results():
    bench = load_bench("verdict_cost")
    messages = [Message("system", "s"), Message("user", "u"),
                call("find_user_id_by_email", 1), Message("tool", "id", tool_call_id="c1", name="find_user_id_by_email"),
                Message("assistant", None, tool_calls=(ToolCall("c2", "get_order_details", {}),
                                                      ToolCall("c3", "get_order_details", {}))),
                Message("tool", "a", tool_call_id="c2", name="get_order_details"),
                Message("tool", "b", tool_call_id="c3", name="get_order_details"),
                call("cancel_pending_order", 4), Message("tool", "done", tool_call_id="c4", name="cancel_pending_order"),
                Message("assistant", "Cancelled.")]
    traj = SimpleNamespace(messages=messages)
    # nothing accepted: the context itself; then each step with every result recorded after it,
    # a write's real result included (not the placeholder the verify prompt showed)
    assert [bench.committed_end(traj, 2, k) for k in range(5)] == [2, 4, 7, 9, 10]
    assert bench.cut_point(traj) == 7  # the middle assistant step
