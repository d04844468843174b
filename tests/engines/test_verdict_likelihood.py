"""The likelihood verdict: the strong model's own token probabilities of each drafted step.

Its promise: at the default threshold a step is accepted exactly when greedy decoding by the
strong model would have written it, so the committed run is the strong model's own."""

from __future__ import annotations

import math

import pytest

from specagent.config import ArmConfig, RuntimeSpec, VerifierConfig
from specagent.core.errors import ConfigError
from specagent.core.types import DraftedStep, Message, Segment, StepKind, ToolCall
from specagent.engines.verdict_likelihood import LikelihoodVerifier, step_scores, step_token_spans
from tests.conftest import WEATHER, weather_chat


def test_a_step_scores_one_when_greedy_else_its_least_likely_off_greedy_token():
    entries = [[-0.1, 1.0], [-2.0, 1.0], [math.log(0.3), 0.0], [math.log(0.6), 0.0], [-0.5, 1.0]]
    assert step_scores(entries, [(10, 11), (12, 13), (14, 14)]) == pytest.approx([1.0, 0.3, 1.0])


def test_thresholds_and_backends_are_checked_where_they_are_configured():
    assert VerifierConfig(kind="likelihood", threshold=1.0).threshold == 1.0  # greedy steps only
    ArmConfig(name="sweep", mode="specagent", verifier=VerifierConfig(kind="likelihood"), threshold_sweep=[1.0, 0.5])
    with pytest.raises(ValueError, match="threshold_sweep needs a head or likelihood"):
        ArmConfig(name="sweep", mode="specagent", threshold_sweep=[0.5])
    from specagent.runtime.assembly import plan_models

    spec = RuntimeSpec.model_validate({"env": {"name": "store"}, "strong": {"backend": "openai", "model": "s",
                                                                          "base_url": "http://127.0.0.1:9/v1"},
                                       "verifier": {"kind": "likelihood"}})
    with pytest.raises(ConfigError, match="likelihood' needs a strong engine that scores"):
        plan_models(spec, ("specagent",))
    remote_drafter = RuntimeSpec.model_validate({
        "env": {"name": "store"}, "strong": {"backend": "transformers", "model": "smollm2"},
        "weak": {"backend": "openai", "model": "w", "base_url": "http://127.0.0.1:9/v1"},
        "verifier": {"kind": "likelihood"}, "protocol": {"draft_stop_below": 0.3}})
    with pytest.raises(ConfigError, match="draft_stop_below: a drafter behind the openai backend"):
        plan_models(remote_drafter, ("specagent",))
    plan_models(remote_drafter.model_copy(update={"protocol": remote_drafter.protocol.model_copy(
        update={"draft_stop_below": 0.0})}), ("specagent",))


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_dir):
    from specagent.engines.transformers_engine import TransformersEngine

    return TransformersEngine(smollm2_dir, max_model_len=4096, threads=1)


def greedy_step(engine, context, kind=None, observation=None):
    from specagent.core.interfaces import ChatRequest

    done = engine.chat([ChatRequest(context, [WEATHER], max_tokens=64)])[0]
    if done.finish_reason != "stop" or done.malformed:
        pytest.skip(f"greedy SmolLM2 did not close its turn here ({done.finish_reason}, {done.malformed})")
    message = done.message
    if message.tool_calls:
        obs = tuple(Message("tool", observation, tool_call_id=c.id, name=c.name) for c in message.tool_calls)
        return DraftedStep(message, StepKind.READ, obs)
    return DraftedStep(message, StepKind.REPLY)


def test_spans_are_exactly_the_drafted_turns(smollm2_engine):
    tokenizer = smollm2_engine.tokenizer
    call = Message("assistant", None, tool_calls=(ToolCall("c1", "get_weather", {"city": "Paris"}),))
    steps = [DraftedStep(call, StepKind.READ, (Message("tool", "Paris: 20C", tool_call_id="c1", name="get_weather"),)),
             DraftedStep(Message("assistant", "It is 20C in Paris."), StepKind.REPLY)]
    context = weather_chat("Paris")
    messages = [*context, steps[0].message, *steps[0].observations, steps[1].message]
    ids, spans = step_token_spans(tokenizer, messages, [WEATHER], [len(context), len(context) + 2])
    first, second = (tokenizer.decode(ids[a: b + 1]) for a, b in spans)
    assert first.startswith("<tool_call>") and '"Paris"' in first and first.endswith("</tool_call><|im_end|>")
    assert second == "It is 20C in Paris.<|im_end|>"


def test_the_strong_models_own_greedy_steps_are_accepted_and_a_changed_one_is_not(smollm2_engine):
    """Two steps greedy SmolLM2 writes itself (a call, then its reply) are both accepted at the
    default threshold, scored as an independent full forward pass scores them; the same call
    with another city is rejected, and a repair follows from the first step."""
    import torch

    context = weather_chat("Paris")
    call = greedy_step(smollm2_engine, context, observation="Paris: 20C, clear")
    reply = greedy_step(smollm2_engine, [*context, call.message, *call.observations])
    verifier = LikelihoodVerifier(smollm2_engine)
    verdict, usages = verifier.verify(context, [WEATHER], Segment(len(context), (call, reply), "held"))
    assert verdict.accepted == 2 and verdict.scores == (1.0, 1.0) and verdict.raw.startswith("likelihood")
    assert [u.completion_tokens for _, u in usages] == [0]

    changed = [c.__class__(c.id, c.name, {**c.arguments, "city": "Lyon"}) for c in call.message.tool_calls]
    wrong = DraftedStep(Message("assistant", None, tool_calls=tuple(changed)), StepKind.READ, call.observations)
    verdict, _ = verifier.verify(context, [WEATHER], Segment(len(context), (wrong, reply), "held"))
    assert verdict.accepted == 0 and verdict.scores[0] < 1.0

    # the same scores from a plain forward pass over the whole rendered prompt
    messages = [*context, wrong.message, *wrong.observations, reply.message]
    ids, spans = step_token_spans(smollm2_engine.tokenizer, messages, [WEATHER], [len(context), len(context) + 2])
    with torch.inference_mode():
        logprobs = torch.log_softmax(smollm2_engine.model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    expected = []
    for a, b in spans:
        off = [math.exp(logprobs[t - 1, ids[t]]) for t in range(a, b + 1) if int(logprobs[t - 1].argmax()) != ids[t]]
        expected.append(min(off) if off else 1.0)
    assert list(verdict.scores) == pytest.approx(expected, abs=1e-4)
    lenient = LikelihoodVerifier(smollm2_engine, threshold=min(expected[0], 0.999) * 0.99)
    assert lenient.verify(context, [WEATHER], Segment(len(context), (wrong, reply), "held"))[0].accepted >= 1


def test_the_runtime_builds_it_from_the_config(smollm2_engine):
    from specagent.envs.store import StoreEnv
    from specagent.runtime.assembly import build_verifier, plan_models

    spec = RuntimeSpec.model_validate({"env": {"name": "store"}, "strong": {"backend": "transformers"},
                                       "verifier": {"kind": "likelihood", "threshold": 0.5}})
    verifier = build_verifier(spec, plan_models(spec, ("specagent",)), smollm2_engine, StoreEnv())
    assert isinstance(verifier, LikelihoodVerifier) and verifier.threshold == 0.5


def test_a_repair_goes_on_from_the_rejected_steps_greedy_opening_and_writes_the_same_step(smollm2_engine):
    """The call with another city leaves greedy SmolLM2's path at the city: the verdict names
    the step's text up to there, and the repair that continues from it writes the step the
    repair from scratch writes, decoding fewer tokens."""
    from specagent.core.interfaces import ChatRequest

    context = weather_chat("Paris")
    call = greedy_step(smollm2_engine, context, observation="Paris: 20C, clear")
    changed = [c.__class__(c.id, c.name, {**c.arguments, "city": "Lyon"}) for c in call.message.tool_calls]
    wrong = DraftedStep(Message("assistant", None, tool_calls=tuple(changed)), StepKind.READ, call.observations)
    verdict, _ = LikelihoodVerifier(smollm2_engine).verify(context, [WEATHER], Segment(len(context), (wrong,), "held"))
    assert verdict.accepted == 0
    assert verdict.repair_from.startswith("<tool_call>") and "get_weather" in verdict.repair_from
    assert "Lyon" not in verdict.repair_from

    scratch = smollm2_engine.chat([ChatRequest(context, [WEATHER], max_tokens=64)])[0]
    went_on = smollm2_engine.chat([ChatRequest(context, [WEATHER], max_tokens=64, continuation=verdict.repair_from)])[0]
    assert went_on.text == scratch.text and went_on.message.tool_calls == scratch.message.tool_calls
    opening_tokens = len(smollm2_engine.tokenizer(verdict.repair_from, add_special_tokens=False)["input_ids"])
    assert went_on.usage.completion_tokens == scratch.usage.completion_tokens - opening_tokens
    assert went_on.usage.prompt_tokens == scratch.usage.prompt_tokens + opening_tokens

    # switched off, or scored on an adapter the repair does not run on: no opening
    off = LikelihoodVerifier(smollm2_engine, continue_repairs=False)
    assert off.verify(context, [WEATHER], Segment(len(context), (wrong,), "held"))[0].repair_from == ""
    assert not LikelihoodVerifier(smollm2_engine, adapter="judge").continue_repairs

    # an engine that would ignore the continuation (the openai backend) is never given one
    from specagent.engines.batching import BatchingEngine
    from specagent.engines.openai_engine import OpenAIEngine

    assert LikelihoodVerifier(BatchingEngine(smollm2_engine)).continue_repairs
    assert not LikelihoodVerifier(OpenAIEngine("http://127.0.0.1:9/v1", "m")).continue_repairs


def test_an_opening_is_only_text_of_the_step_itself():
    from specagent.engines.verdict_likelihood import greedy_run, opening_text

    class Chars:  # one token per character
        def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
            return {"offset_mapping": [(i, i + 1) for i in range(len(text))]}

    assert greedy_run([[-0.1, 1.0], [-0.2, 1.0], [-3.0, 0.0], [-0.1, 1.0]]) == 2
    assert greedy_run([[-0.1, 1.0]]) == 1 and greedy_run([[-2.0, 0.0]]) == 0
    assert opening_text(Chars(), "HEADER|step text", "HEADER|", 10) == "step"
    assert opening_text(Chars(), "HEADER|step text", "HEADER|", 6) == ""  # ends inside the header
    assert opening_text(Chars(), "HEADER|step text", "OTHER|", 10) == ""  # not the same context

    class Merged(Chars):  # a token that spans the header's end
        def __call__(self, text, **kw):
            return {"offset_mapping": [(0, 6), (6, 8), *[(i, i + 1) for i in range(8, len(text))]]}

    assert opening_text(Merged(), "HEADER|step text", "HEADER|", 3) == ""
    assert opening_text(Chars(), "HEADER|step", "HEADER|", 99) == ""  # no such token


def doubt_bound(engine, context, text):
    """A probability bound at which greedy decoding of `text` stops inside it, and after how many
    tokens: between the first token (not the first) less likely than every one before it and
    the least likely of those (greedy tokens: each is the top one, its probability the top's)."""
    from specagent.core.interfaces import ScoreRequest
    from specagent.engines.render import render_prompt

    prompt = render_prompt(engine.tokenizer, context, [WEATHER])
    ids = engine.tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
    start = len(engine.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    scored = engine.score([ScoreRequest(ids, list(range(start - 1, len(ids) - 1)), own=True)])[0]
    probs = [math.exp(logprob) for logprob, _ in scored.logprobs]
    low = next((j for j in range(1, len(probs)) if probs[j] < min(probs[:j])), None)
    if low is None:
        pytest.skip("no token of the greedy step is less likely than all before it")
    return (probs[low] + min(probs[:low])) / 2, low


def test_an_unsure_drafter_stops_at_its_doubt_and_the_repair_goes_on_from_what_s_would_write(smollm2_engine):
    """`stop_below`: SmolLM2 drafting stops before the first token it is less sure of than the
    bound, its text so far a prefix of its greedy step; scored as a segment's unfinished step,
    the text SmolLM2 (here also the strong model) would write is the repair's opening, and the
    repair then writes the greedy step, decoding only the rest. A wrong ending is cut off."""
    from specagent.core.interfaces import ChatRequest

    context = weather_chat("Paris")
    scratch = smollm2_engine.chat([ChatRequest(context, [WEATHER], max_tokens=64)])[0]
    sure = smollm2_engine.chat([ChatRequest(context, [WEATHER], max_tokens=64, stop_below=1e-9)])[0]
    assert (sure.text, sure.finish_reason) == (scratch.text, scratch.finish_reason)
    bound, written = doubt_bound(smollm2_engine, context, scratch.text)
    unsure = smollm2_engine.chat([ChatRequest(context, [WEATHER], max_tokens=64, stop_below=bound)])[0]
    assert unsure.finish_reason == "unsure" and unsure.usage.completion_tokens == written + 1  # the doubting pass ran
    assert scratch.text.startswith(unsure.text) and 0 < len(unsure.text) < len(scratch.text)
    assert len(smollm2_engine.tokenizer(unsure.text, add_special_tokens=False)["input_ids"]) == written

    verifier = LikelihoodVerifier(smollm2_engine)
    verdict, usages = verifier.verify(context, [WEATHER], Segment(len(context), (), "unsure", partial=unsure.text))
    assert verdict.accepted == 0 and verdict.repair_from == unsure.text
    assert f"unfinished {written}/{written}" in verdict.raw and [u.completion_tokens for _, u in usages] == [0]
    went_on = smollm2_engine.chat([ChatRequest(context, [WEATHER], max_tokens=64, continuation=verdict.repair_from)])[0]
    assert went_on.text == scratch.text
    assert went_on.usage.completion_tokens == scratch.usage.completion_tokens - written

    wrong = unsure.text + " Zzyzx"
    verdict, _ = verifier.verify(context, [WEATHER], Segment(len(context), (), "unsure", partial=wrong))
    assert unsure.text.startswith(verdict.repair_from) or verdict.repair_from.startswith(unsure.text)
    assert "Zzyzx" not in verdict.repair_from
    # a verifier that cannot continue a repair does not read unfinished steps
    assert not LikelihoodVerifier(smollm2_engine, continue_repairs=False).reads_partial


def test_a_greedy_step_a_head_rejects_is_repaired_as_that_one_step(smollm2_engine):
    """A head may reject a step S would write token for token (the greedy rule never does). The
    repair then goes on from the step's text short of its closing token and writes that one step
    again: before, the opening took the whole turn, and S went on past it into a second call of
    the same turn (in the quickstart's eval, a cancel sent twice)."""
    from specagent.core.interfaces import ChatRequest
    from specagent.engines.likelihood_head import FEATURES, LikelihoodHead

    context = weather_chat("Paris")
    step = greedy_step(smollm2_engine, context, observation="Paris: 20C, clear")
    no = LikelihoodHead(weights=(0.0,) * len(FEATURES), bias=-10.0, mean=(0.0,) * len(FEATURES),
                        scale=(1.0,) * len(FEATURES), threshold=0.5)
    verdict, _ = LikelihoodVerifier(smollm2_engine, head=no).verify(context, [WEATHER],
                                                                    Segment(len(context), (step,), "held"))
    assert verdict.accepted == 0 and verdict.repair_from.startswith("<tool_call>")
    assert "<|im_end|>" not in verdict.repair_from
    scratch = smollm2_engine.chat([ChatRequest(context, [WEATHER], max_tokens=64)])[0]
    went_on = smollm2_engine.chat([ChatRequest(context, [WEATHER], max_tokens=64, continuation=verdict.repair_from)])[0]
    assert went_on.message.tool_calls == scratch.message.tool_calls == step.message.tool_calls
    assert 0 < went_on.usage.completion_tokens < scratch.usage.completion_tokens
