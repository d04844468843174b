"""Class 1 attacks: verdict replies that say less than "accept every step".

A reply grants a prefix only when it states one unambiguously: a count alone, or "all" /
"none" alone (DESIGN §1). The property tests draw replies from a grammar of the ways a
model can hedge (negations, "all but", counts in words, trailing junk) plus arbitrary text,
and compare the parser with an independent reading written with plain string methods."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, ToolCall
from specagent.core.verify import GenerativeVerifier, parse_verdict
from specagent.engines.scripted import ScriptedEngine
from tests.core.toy import ToyEnv

NEGATIONS = ("not", "no", "n't", "never", "none", "nothing", "but", "except", "reject", "wrong", "invalid")
WORDS = ("one", "two", "three", "zero", "all", "none", "every", "each", "both")


def reference_grant(text: str, k: int) -> int:
    """What the reply grants, read without regular expressions: a bare ASCII count up to k
    (after an optional "answer"/"verdict"/"accepted" label and ":" or "="), "all" -> k,
    anything else -> 0."""
    reply = " ".join(text.lower().split())
    if reply.endswith("."):
        reply = reply[:-1].rstrip()
    for label in ("answer", "verdict", "accepted"):
        if reply.startswith(label):
            reply = reply[len(label):].lstrip()
            if reply[:1] in (":", "="):
                reply = reply[1:].lstrip()
            break
    if reply.isascii() and reply.isdigit() and len(reply) <= 4:
        return int(reply) if int(reply) <= k else 0
    return k if reply == "all" else 0


def has_negation(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered.replace("n't", " n't ").replace(",", " ").split() for word in NEGATIONS) or "n't" in lowered


HEDGES = st.sampled_from([
    "", "accept", "accept all", "all", "all but one", "all but the last", "not all", "none", "accept none",
    "reject", "reject all", "all of them are wrong", "all steps are invalid", "accepted: none", "no", "nothing",
    "all except step 2", "accept everything except the write", "I accept none of them", "zero", "two", "three",
])
COUNTS = st.integers(min_value=-3, max_value=12).map(str)
LABELS = st.sampled_from(["", "Answer:", "answer =", "Verdict:", "verdict=", "Accepted:", "I think", "The last"])
SUFFIXES = st.sampled_from(["", ".", " steps", " (two)", " but the last is wrong", "\n3", " not", " - no",
                            "/3", " of 3", " steps are valid", "!", "?", " all"])
REPLIES = st.one_of(
    st.tuples(LABELS, st.one_of(COUNTS, HEDGES), SUFFIXES).map(lambda t: " ".join(p for p in t if p)),
    st.tuples(HEDGES, SUFFIXES).map("".join),
    st.text(max_size=40),
)


@settings(max_examples=600, deadline=None)
@given(REPLIES, st.integers(min_value=0, max_value=6))
def test_a_reply_never_grants_more_than_it_states(reply, k):
    granted = parse_verdict(reply, k)
    assert granted is None or 0 <= granted <= k
    assert (granted or 0) <= reference_grant(reply, k)


@settings(max_examples=400, deadline=None)
@given(REPLIES.filter(has_negation), st.integers(min_value=1, max_value=6))
def test_a_reply_with_a_negation_grants_nothing(reply, k):
    assert not parse_verdict(reply, k)


def test_the_explicit_forms_grant_what_they_say():
    for reply, expected in [("2", 2), (" 2.", 2), ("Answer: 1", 1), ("verdict=0", 0), ("all", 3), ("All.", 3),
                            ("none", 0), ("3", 3)]:
        assert parse_verdict(reply, 3) == expected
    for reply in ["7", "-1", "Accept all", "accept", "reject", "all but one", "2 steps", "two", "2\nThe first",
                  "The last 1 assistant step is a", "", "<tool_call>", "٢", "²"]:
        assert parse_verdict(reply, 3) is None


def _held_write_episode(reply: str):
    """A draft of one lookup then a held write; the strong model's verdict reply is `reply`."""
    def weak(messages, tools):
        done = sum(m.role == "assistant" for m in messages)
        if done == 0:
            return Message("assistant", tool_calls=(ToolCall("x", "get", {"key": "a"}),))
        return Message("assistant", tool_calls=(ToolCall("y", "set", {"key": "a", "value": 7}),))

    def strong(messages, tools):
        if messages[-1].role == "user" and "REVIEW" in (messages[-1].content or ""):
            return Message("assistant", content=reply)
        return Message("assistant", content="done")

    env = ToyEnv()
    engine = ScriptedEngine(strong, "strong")
    models = Models(engine, ScriptedEngine(weak, "weak"), GenerativeVerifier(engine))
    return env, run_episode(env, "t0", "specagent", models, ProtocolConfig(max_draft_steps=4, max_steps=2))


@settings(max_examples=200, deadline=None)
@given(REPLIES)
def test_through_the_protocol_the_held_write_runs_only_on_a_full_grant(reply):
    env, ep = _held_write_episode(reply)
    full = reference_grant(reply, 2) == 2
    assert bool(env.write_log) == full
    first_round = [s.status.value for s in ep.steps if s.round == 0]
    assert ("held_approved" in first_round) == full
    assert first_round.count("repaired") == (0 if full else 1)  # never both actions in one round
    assert ep.verdicts[0].startswith("(invalid verdict") == (parse_verdict(reply, 2) is None)
