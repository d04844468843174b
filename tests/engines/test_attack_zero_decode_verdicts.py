"""Attacks on the zero-decode verdicts' inputs (the likelihood verdict, its head, a LoRA verdict head): whatever the strong engine reports for the drafted
steps' tokens, and whatever (finite) head scores them, a held write runs only when the report is
well formed and every drafted step scores at least the threshold.

The strong engine here is a stand-in for its scoring face only (`TokenScorer`): SmolLM2's real
tokenizer renders the real verify prompt, and hypothesis writes the report — too few or too many
positions, NaN or positive "log-probabilities", greedy flags that are neither 0 nor 1, entries of
the wrong shape. A report the verifier cannot trust must read as an invalid verdict (everything
rejected, the step repaired), never as "no off-greedy token"."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specagent.core.errors import ConfigError
from specagent.core.interfaces import Scores
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, ToolCall, Usage
from specagent.engines.likelihood_head import FEATURES, LikelihoodHead
from specagent.engines.render import FULL
from specagent.engines.scripted import ScriptedEngine
from specagent.engines.verdict_head import HeadSpec, HeadVerifier, probability
from specagent.engines.verdict_likelihood import LikelihoodVerifier
from tests.core.toy import ToyEnv

K = 2  # the draft: one lookup, then a held write


def weak(messages, tools):
    if sum(m.role == "assistant" for m in messages) == 0:
        return Message("assistant", tool_calls=(ToolCall("x", "get", {"key": "a"}),))
    return Message("assistant", tool_calls=(ToolCall("y", "set", {"key": "a", "value": 7}),))


LOGPROBS = st.one_of(st.floats(max_value=0.0), st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from([0.0, -0.0, -math.inf, math.inf, math.nan, 1e-9]), st.integers(-30, 3))
FLAGS = st.one_of(st.sampled_from([0, 1, 0.0, 1.0, True, False]), st.floats(allow_nan=True), st.none(),
                  st.integers(-2, 3))
GOOD = st.tuples(st.floats(min_value=-40.0, max_value=0.0), st.sampled_from([0.0, 1.0])).map(list)
ENTRY = st.one_of(GOOD, GOOD, st.tuples(LOGPROBS, FLAGS).map(list), st.tuples(LOGPROBS).map(list),
                  st.text(max_size=3), st.none(), st.tuples(LOGPROBS, FLAGS, FLAGS).map(list))
PAIR = st.one_of(st.tuples(st.floats(-40.0, 0.0), st.floats(-40.0, 0.0)).map(list),
                 st.tuples(LOGPROBS, LOGPROBS).map(list), st.tuples(LOGPROBS).map(list), st.none(), st.text(max_size=2))
HEADS = st.builds(
    LikelihoodHead,
    weights=st.tuples(*[st.floats(-50, 50)] * len(FEATURES)), bias=st.floats(-50, 50),
    mean=st.tuples(*[st.floats(-5, 5)] * len(FEATURES)), scale=st.tuples(*[st.floats(0.01, 5)] * len(FEATURES)),
    threshold=st.floats(0.01, 1.0))


def well_formed(entry) -> bool:
    if not isinstance(entry, list) or len(entry) != 2:
        return False
    logprob, top = entry
    number = isinstance(logprob, (int, float)) and not isinstance(logprob, bool)
    return number and logprob <= 0.0 and (isinstance(top, (int, float)) and top in (0.0, 1.0))


def runs(positions):
    """Scored positions grouped per step: each step's tokens are read at consecutive positions."""
    groups = []
    for p in positions:
        if groups and p == groups[-1][-1] + 1:
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


class Reports:
    """The strong engine's scoring face: SmolLM2's tokenizer and prompt; the report is drawn."""

    model_name = "strong"
    continues_messages = False

    def __init__(self, tokenizer, data, entry) -> None:
        self.tokenizer, self.data, self.entry, self.calls = tokenizer, data, entry, []

    def profile_for(self, adapter):
        return FULL

    def score(self, requests):
        (request,) = requests
        n = len(request.positions)
        exact = self.data.draw(st.booleans())
        size = n if exact else self.data.draw(st.integers(0, n + 3))
        entries = self.data.draw(st.lists(self.entry, min_size=size, max_size=size))
        self.calls.append((runs(request.positions), entries))
        return [Scores(logprobs=entries, usage=Usage(prompt_tokens=len(request.token_ids)))]


def approves(verifier, groups, entries) -> bool:
    if isinstance(verifier, HeadVerifier):  # one [yes, no] pair per step's closing token
        if len(entries) != len(groups) or not all(map(pair, entries)):
            return False
        return all(probability(*e) >= verifier.threshold for e in entries)
    """Whether a report should approve every drafted step: well formed, and each step at threshold."""
    if len(entries) != sum(map(len, groups)) or not all(map(well_formed, entries)):
        return False
    at, scores = 0, []
    for group in groups:
        own = [[float(lp), float(top)] for lp, top in entries[at: at + len(group)]]
        at += len(group)
        if verifier.head is not None:
            scores.append(verifier.head.score(own))
        else:  # the greedy rule: 1.0, or the least probability of a token that is not the top one
            scores.append(min((math.exp(lp) for lp, top in own if not top), default=1.0))
    return all(s >= verifier.threshold for s in scores)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def pair(entry) -> bool:
    return (isinstance(entry, list) and len(entry) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x <= 0.0 for x in entry))


def attack(tokenizer, data, head, verdict_head=None):
    env = ToyEnv()
    reports = Reports(tokenizer, data, PAIR if verdict_head else ENTRY)
    verifier = (HeadVerifier(reports, verdict_head, threshold=data.draw(st.floats(0.01, 1.0))) if verdict_head
                else LikelihoodVerifier(reports, head=head))
    strong = ScriptedEngine(lambda m, t: Message("assistant", content="done"), "strong")
    models = Models(strong, ScriptedEngine(weak, "weak"), verifier)
    ep = run_episode(env, "t0", "specagent", models, ProtocolConfig(max_draft_steps=4, max_steps=2))
    assert reports.calls and len(reports.calls) == len(ep.verdicts)  # one report per round's verdict
    approved_rounds = 0
    for r, (groups, entries) in enumerate(reports.calls):
        # every draft ends on the held write: round 0 a lookup and the write, later rounds the write
        assert len(groups) == (K if r == 0 else 1)
        statuses = [s.status.value for s in ep.steps if s.round == r]
        approved = approves(verifier, groups, entries)
        assert ("held_approved" in statuses) == approved
        assert statuses.count("repaired") == (0 if approved else 1)  # never both
        malformed = (len(entries) != len(groups) or not all(map(pair, entries)) if verdict_head else
                     len(entries) != sum(map(len, groups)) or not all(map(well_formed, entries)))
        assert ep.verdicts[r].startswith("(invalid verdict") == malformed
        approved_rounds += approved
    assert len(env.write_log) == approved_rounds  # no write outside an approved round
    assert ep.stop_reason


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), head=HEADS)
def test_a_head_approves_a_write_only_on_a_well_formed_report_that_clears_its_threshold(tokenizer, data, head):
    attack(tokenizer, data, head)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_greedy_rule_approves_a_write_only_on_a_well_formed_report_of_greedy_tokens(tokenizer, data):
    attack(tokenizer, data, None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_lora_verdict_head_approves_a_write_only_on_a_well_formed_report_that_clears_its_threshold(
        tokenizer, data, lora_head_dir):
    attack(tokenizer, data, None, lora_head_dir)


@pytest.fixture(scope="module")
def lora_head_dir(tmp_path_factory):
    """A verdict head's dir as the verifier reads it (its spec; the adapter is never loaded here)."""
    path = tmp_path_factory.mktemp("verdict-head")
    HeadSpec().save(path)
    (path / "adapter_config.json").write_text("{}")
    return path


@pytest.mark.parametrize("field, value", [("threshold", float("nan")), ("threshold", 0.0), ("threshold", 1.5),
                                          ("bias", float("inf")), ("weights", [1.0]), ("scale", [0.0] * len(FEATURES)),
                                          ("mean", [float("nan")] * len(FEATURES))])
def test_a_head_file_with_numbers_fit_never_writes_is_refused(tmp_path, field, value):
    head = LikelihoodHead(weights=(0.0,) * len(FEATURES), bias=0.0, mean=(0.0,) * len(FEATURES),
                          scale=(1.0,) * len(FEATURES))
    path = head.save(tmp_path)
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=field):
        LikelihoodHead.load(tmp_path)
    LikelihoodHead.load(head.save(tmp_path / "ok"))  # the unchanged file loads
