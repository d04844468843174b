"""Class 2 attacks: verifiers that return something other than an integer in [0, k], or raise.

Whatever a verifier returns, the round either runs the approved held write or repairs
(never both), an invalid verdict is counted in `invalid_verdicts`, and the episode ends
normally (no exception escapes)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, ToolCall, Usage, Verdict
from specagent.engines.scripted import ScriptedEngine
from tests.core.toy import ToyEnv

K = 2  # the draft below: one lookup, then a held write


def weak(messages, tools):
    if sum(m.role == "assistant" for m in messages) == 0:
        return Message("assistant", tool_calls=(ToolCall("x", "get", {"key": "a"}),))
    return Message("assistant", tool_calls=(ToolCall("y", "set", {"key": "a", "value": 7}),))


class Returns:
    """A verifier that returns `value` as its verdict's `accepted`, or `value` itself, or raises it."""

    def __init__(self, value, how: str) -> None:
        self.value, self.how = value, how

    def verify(self, context, tools, segment):
        if self.how == "raise":
            raise self.value
        if self.how == "bare":
            return self.value
        return Verdict(accepted=self.value, raw=repr(self.value)), [("strong", Usage(prompt_tokens=10))]


VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.none(), st.text(max_size=5), st.booleans(),
    st.integers(min_value=-10**6, max_value=10**6), st.lists(st.integers(), max_size=3),
    st.fractions(), st.complex_numbers(allow_nan=False), st.just(float(K)), st.just(str(K)),
)
ERRORS = st.sampled_from([RuntimeError("boom"), ValueError("bad"), ZeroDivisionError(), KeyError("x"),
                          TimeoutError(), RecursionError(), MemoryError("oom"), AttributeError("none")])


def valid(value) -> bool:
    return type(value) is int and 0 <= value <= K


def run(verifier):
    env = ToyEnv()
    strong = ScriptedEngine(lambda m, t: Message("assistant", content="done"), "strong")
    models = Models(strong, ScriptedEngine(weak, "weak"), verifier)
    ep = run_episode(env, "t0", "specagent", models, ProtocolConfig(max_draft_steps=4, max_steps=2))
    return env, ep


def first_round(ep):
    return [s.status.value for s in ep.steps if s.round == 0]


def invalid_rounds(ep) -> list[bool]:
    """Per round, whether its verdict was invalid; checks the episode's count against them."""
    flags = [v.startswith("(invalid verdict") for v in ep.verdicts]
    assert ep.invalid_verdicts == sum(flags) == ep.counts()["invalid_verdicts"]
    return flags


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_only_an_integer_in_range_is_a_verdict(value):
    env, ep = run(Returns(value, "verdict"))
    statuses = first_round(ep)
    approved = valid(value) and value == K
    assert bool(env.write_log) == approved
    assert ("held_approved" in statuses) == approved
    assert statuses.count("repaired") == (0 if approved else 1)  # never both actions
    assert invalid_rounds(ep)[0] == (not valid(value))


@settings(max_examples=100, deadline=None)
@given(st.one_of(VALUES, st.tuples(VALUES), st.tuples(VALUES, VALUES, VALUES)))
def test_a_verifier_that_returns_no_verdict_at_all_rejects_everything(value):
    env, ep = run(Returns(value, "bare"))
    assert env.write_log == [] and invalid_rounds(ep)[0]
    assert first_round(ep).count("repaired") == 1


@settings(max_examples=50, deadline=None)
@given(ERRORS)
def test_a_verifier_that_raises_rejects_everything_and_the_episode_goes_on(error):
    env, ep = run(Returns(error, "raise"))
    assert env.write_log == [] and invalid_rounds(ep)[0]
    assert first_round(ep) == ["rejected", "rejected", "repaired"]
    assert ep.verdicts[0].startswith("(invalid verdict: the verifier raised")
    assert ep.stop_reason  # the episode ended normally


def test_numpy_style_integers_are_verdicts():
    class Integral(int):  # stands for numpy.int64 & co: an Integral that is not exactly int
        pass

    env, ep = run(Returns(Integral(K), "verdict"))
    assert env.write_log and not invalid_rounds(ep)[0]


class Opens:
    """A verifier whose verdict also names an opening for the repair (`Verdict.repair_from`),
    as a verdict object or as a look-alike that is not one."""

    def __init__(self, value, opening, bare: bool = False) -> None:
        self.value, self.opening, self.bare = value, opening, bare

    def verify(self, context, tools, segment):
        if self.bare:
            return type("LookAlike", (), {"accepted": self.value, "repair_from": self.opening})(), []
        return Verdict(accepted=self.value, raw="", repair_from=self.opening), [("strong", Usage(prompt_tokens=10))]


@settings(max_examples=200, deadline=None)
@given(st.one_of(VALUES, st.integers(0, K)), st.one_of(st.text(max_size=8), st.none(), st.integers(), st.binary()),
       st.booleans())
def test_a_repair_continues_only_from_a_valid_verdicts_own_opening(value, opening, bare):
    """The strong engine is asked to continue a text only when the verdict is valid, rejects a
    step, and names a non-empty string; whatever else a verifier returns, the repair is whole."""
    asked = []

    class Strong(ScriptedEngine):
        def chat(self, requests):
            asked.extend(r.continuation for r in requests)
            return super().chat(requests)

    env = ToyEnv()
    models = Models(Strong(lambda m, t: Message("assistant", content="done"), "strong"), ScriptedEngine(weak, "weak"),
                    Opens(value, opening, bare))
    ep = run_episode(env, "t0", "specagent", models, ProtocolConfig(max_draft_steps=4, max_steps=2))
    approved = not bare and valid(value) and value == K
    continues = not bare and valid(value) and value < K and isinstance(opening, str) and opening != ""
    assert (asked[0] if asked else None) == (None if approved else opening if continues else "")
    assert asked == [opening if continues else ""] * len(asked)  # every round's repair (the verdict repeats)
    assert ep.continued_repairs == ep.counts()["continued_repairs"] == (len(asked) if continues else 0)
    assert len(asked) == ep.counts()["repairs"]
    assert bool(env.write_log) == approved
