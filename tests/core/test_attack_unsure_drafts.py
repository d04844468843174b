"""Unsure drafts (`ChatRequest.stop_below`): a drafter that stops a step where it is unsure.

The unfinished step (`Segment.partial`) is text only: whatever it says, whatever message the
engine attaches to it (a write call included) and whatever a verdict then returns, it is never
parsed, executed or committed. Only S's repair is, continued from the verdict's opening when
the verdict is valid, accepted every finished step and names a non-empty string."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.draft import DraftJob, draft_batch
from specagent.core.interfaces import Completion
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, ToolCall, Usage, Verdict
from specagent.engines.scripted import ScriptedEngine
from tests.core.test_attack_verdict_values import VALUES, valid
from tests.core.toy import ToyEnv

LOOKUP = Message("assistant", tool_calls=(ToolCall("x", "get", {"key": "a"}),))
WRITE = Message("assistant", tool_calls=(ToolCall("w", "set", {"key": "a", "value": 99}),))
WRITE_TEXT = '<tool_call>\n{"name": "set", "arguments": {"key": "a", "value": 99}}\n</tool_call>'


class Unsure(ScriptedEngine):
    """A drafter that writes one lookup, then is unsure: its completion is `text` with
    finish_reason "unsure" and, hostile, a parsed write call as its message."""

    def __init__(self, text: str, lookups: int = 1) -> None:
        super().__init__(lambda m, t: LOOKUP, "weak")
        self.text, self.lookups, self.asked = text, lookups, []

    def chat(self, requests):
        self.asked.extend(r.stop_below for r in requests)
        out = []
        for request in requests:
            drafted = sum(m.role == "assistant" for m in request.messages)
            if drafted < self.lookups:
                out.extend(super().chat([request]))
            else:
                out.append(Completion(self.text, WRITE, Usage(prompt_tokens=10, completion_tokens=3),
                                      finish_reason="unsure"))
        return out


class Verdicts:
    """A verifier returning `value` as its verdict and `opening` as its repair opening."""

    def __init__(self, value, opening, reads_partial: bool) -> None:
        self.value, self.opening, self.reads_partial, self.seen = value, opening, reads_partial, []

    def verify(self, context, tools, segment):
        self.seen.append(segment)
        return Verdict(accepted=self.value, raw="", repair_from=self.opening), [("strong", Usage(prompt_tokens=10))]


class Strong(ScriptedEngine):
    """S: its repair hands the conversation over (`transfer` ends the episode after one round)."""

    def __init__(self) -> None:
        super().__init__(lambda m, t: Message("assistant", tool_calls=(ToolCall("t", "transfer", {}),)), "strong")
        self.continued = []

    def chat(self, requests):
        self.continued.extend(r.continuation for r in requests)
        return super().chat(requests)


def episode(drafter, verifier, stop_below=0.5):
    env, strong = ToyEnv(), Strong()
    ep = run_episode(env, "t0", "specagent", Models(strong, drafter, verifier),
                     ProtocolConfig(max_draft_steps=4, max_steps=8, draft_stop_below=stop_below))
    return env, strong, ep


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.just(WRITE_TEXT), st.just(json.dumps({"name": "set"}))),
       st.one_of(VALUES, st.integers(0, 1)), st.one_of(st.text(max_size=8), st.none(), st.integers()),
       st.booleans(), st.integers(0, 1))
def test_an_unfinished_step_is_never_run_and_only_a_valid_verdicts_opening_continues_it(text, value, opening,
                                                                                       reads, lookups):
    drafter, verifier = Unsure(text, lookups), Verdicts(value, opening, reads)
    env, strong, ep = episode(drafter, verifier)
    assert env.db["a"] == 0 and len(env.write_log) == 1  # only S's transfer ran, not the partial's write
    assert ep.stop_reason.startswith("terminal:transfer") and ep.counts()["rounds"] == 1
    assert set(drafter.asked) == {0.5}
    assert ep.unsure_drafts == ep.counts()["unsure_drafts"] == 1
    # a round of only an unfinished step reaches the verifier only if the verifier reads it
    judged = lookups > 0 or (bool(text) and reads)
    assert len(verifier.seen) == judged
    for segment in verifier.seen:
        assert segment.ended_by == "unsure" and segment.partial == text and len(segment.steps) == lookups
        assert all(step.message is not WRITE for step in segment.steps)
    # one repair (the unfinished step is never committed), continued only from a valid verdict's
    # own non-empty string
    in_range = type(value) is int and 0 <= value <= lookups
    continues = judged and in_range and isinstance(opening, str) and opening != ""
    assert strong.continued == [opening if continues else ""]
    assert ep.continued_repairs == int(continues) and ep.counts()["repairs"] == 1


def test_draft_batch_keeps_each_unfinished_step_as_text_and_counts_its_decoding():
    used = []
    observe = lambda c: Message("tool", "1", tool_call_id=c.id, name=c.name)  # noqa: E731
    jobs = [DraftJob([Message("user", "q")], observe), DraftJob([Message("user", "r")], observe, budget=1)]
    first, second = draft_batch(Unsure('<tool_call>\n{"na', lookups=1), jobs, ToyEnv().tool_specs(),
                                {"get": True, "set": False}, max_tokens=32, on_usage=used.append, stop_below=0.4)
    assert (first.ended_by, first.partial, len(first.steps)) == ("unsure", '<tool_call>\n{"na', 1)
    assert (second.ended_by, second.partial, len(second.steps)) == ("max_steps", None, 1)  # its budget ran out first
    assert len(used) == 3 and used[-1].completion_tokens == 3  # the unsure call's decoding is counted


def test_without_the_rule_nothing_is_asked_and_no_draft_is_unsure():
    drafter = Unsure("", lookups=9)
    env, strong, ep = episode(drafter, Verdicts(1, "", False), stop_below=0.0)
    assert set(drafter.asked) == {0.0} and ep.unsure_drafts == 0
