"""`protocol.draft_stop_repeats`: a drafted read-only step that repeats a call made since the
last user turn or state-changing call ends the draft without it.

A small drafter re-issues the lookup it just made, and a verdict that approves it approves a
loop. With the rule on, no drafted lookup that repeats such a call is ever executed or
committed, whatever the drafter and the verdict do (generated drafters, an accept-all verdict);
with it off, the same drafters commit repeats."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.classify import classify_tools
from specagent.core.draft import DraftJob, draft_batch, repeats_a_read
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, ToolCall, Usage, Verdict
from specagent.engines.scripted import ScriptedEngine
from tests.core.toy import ToyEnv, random_policy


def call(name: str, **arguments) -> Message:
    return Message("assistant", tool_calls=(ToolCall("x", name, arguments),))


READ_ONLY = classify_tools(ToyEnv().tool_specs())
USER = Message("user", content="task")


def test_a_repeat_is_a_read_made_since_the_last_user_turn_or_write():
    get_a = call("get", key="a")
    assert repeats_a_read([USER, get_a], call("get", key="a"), READ_ONLY)
    assert not repeats_a_read([USER, get_a], call("get", key="b"), READ_ONLY)  # other arguments
    assert not repeats_a_read([get_a, USER], call("get", key="a"), READ_ONLY)  # a user turn since
    assert not repeats_a_read([USER, get_a, call("set", key="b", value=1)], get_a, READ_ONLY)  # a write since
    assert not repeats_a_read([USER, get_a], Message("assistant", content="a is 0"), READ_ONLY)  # not a call
    both = Message("assistant", tool_calls=(ToolCall("x", "get", {"key": "a"}), ToolCall("y", "list_keys", {})))
    assert not repeats_a_read([USER, get_a], both, READ_ONLY)  # one of its calls is new
    assert repeats_a_read([USER, both], call("list_keys"), READ_ONLY)


def test_a_looping_drafter_drafts_its_lookup_once():
    """The same lookup every time: with the rule, the draft is that lookup once, ended by
    `repeat`; without it, the step budget ends a draft of 4 identical lookups."""
    env = ToyEnv()
    context = env.reset("t0")
    loop = ScriptedEngine(lambda m, t: call("get", key="a"), "weak")

    def draft(stop_repeats: bool):
        job = DraftJob(context, lambda c: Message("tool", content=env.execute(c), tool_call_id=c.id, name=c.name))
        return draft_batch(loop, [job], env.tool_specs(), READ_ONLY, 64, stop_repeats=stop_repeats)[0]

    on, off = draft(True), draft(False)
    assert (len(on.steps), on.ended_by) == (1, "repeat")
    assert (len(off.steps), off.ended_by) == (4, "max_steps")


class AcceptAll:
    """A verdict that approves every drafted step."""

    def verify(self, context, tools, segment):
        return Verdict(accepted=len(segment.steps), raw="all"), [("strong", Usage(prompt_tokens=1))]


def committed_repeats(messages) -> int:
    """Drafted-or-not, the committed read steps that repeat a call made since the last user turn
    or state-changing call."""
    return sum(m.role == "assistant" and bool(m.tool_calls) and all(READ_ONLY.get(c.name) for c in m.tool_calls)
               and repeats_a_read(messages[:i], m, READ_ONLY) for i, m in enumerate(messages))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), loop_every=st.integers(1, 3))
def test_no_drafted_repeat_is_executed_or_committed_under_an_accept_all_verdict(seed, loop_every):
    """Generated drafters that repeat their last lookup every `loop_every` steps, an accept-all
    verdict (every drafted step executed is committed), a strong model that hands over: with the
    rule, no committed step repeats a read made since the last user turn or write."""
    inner = random_policy(seed, allow_malformed=False)

    def drafter(messages, tools):
        last = next((m for m in reversed(messages) if m.role == "assistant" and m.tool_calls), None)
        if last is not None and len(messages) % loop_every == 0 and all(READ_ONLY.get(c.name) for c in last.tool_calls):
            return last
        return inner(messages, tools)

    strong = ScriptedEngine(lambda m, t: call("transfer"), "strong")
    ep = run_episode(ToyEnv(), "t0", "specagent", Models(strong, ScriptedEngine(drafter, "weak"), AcceptAll()),
                     ProtocolConfig(max_draft_steps=4, max_steps=12, draft_stop_repeats=True))
    assert committed_repeats(ep.messages) == 0


def test_without_the_rule_a_looping_drafter_commits_its_repeats():
    """The failure the rule exists for: under an accept-all verdict, a drafter that repeats its
    lookup fills the episode with it."""
    strong = ScriptedEngine(lambda m, t: call("transfer"), "strong")
    loop = ScriptedEngine(lambda m, t: call("get", key="a"), "weak")
    ep = run_episode(ToyEnv(), "t0", "specagent", Models(strong, loop, AcceptAll()),
                     ProtocolConfig(max_draft_steps=4, max_steps=12))
    assert committed_repeats(ep.messages) >= 8 and ep.stop_reason == "max_steps"
    ep = run_episode(ToyEnv(), "t0", "specagent", Models(strong, loop, AcceptAll()),
                     ProtocolConfig(max_draft_steps=4, max_steps=12, draft_stop_repeats=True))
    assert committed_repeats(ep.messages) == 0 and sum(m.role == "assistant" for m in ep.messages) == 2
