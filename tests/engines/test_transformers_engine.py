"""The chat template and the transformers engine, on a tiny random Llama with SmolLM2's tokenizer."""

from __future__ import annotations

import json
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specagent.core.errors import ContextLengthExceeded, EngineError
from specagent.core.interfaces import ChatEngine, ChatRequest
from specagent.core.toolcalls import parse_assistant_text
from specagent.core.types import Message, ToolCall, ToolSpec
from specagent.engines.models import materialize
from specagent.engines.render import load_template, render_prompt, template_messages
from specagent.engines.transformers_engine import TransformersEngine

TOOLS = (
    ToolSpec("get_order", "Look up an order by id.",
             {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}, True),
    ToolSpec("cancel_order", "Cancel an order.",
             {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}, False),
)
CHAT = [Message("system", "You are a shop agent."), Message("user", "Where is order #W1?")]


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(materialize("smollm2"))


def tiny_llama(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config).eval()


def force_tokens(model, token_ids: list[int]):
    """Make the model emit `token_ids` as its first generated tokens (every row), then run free."""
    calls = {"n": 0}

    def hook(_module, _inputs, logits):
        step, calls["n"] = calls["n"], calls["n"] + 1
        if step < len(token_ids):
            logits = logits.clone()
            logits[..., token_ids[step]] += 1e4
        return logits

    return model.lm_head.register_forward_hook(hook)


# --- the template -----------------------------------------------------------------------

names = st.sampled_from(["get_order", "cancel_order", "x"])
arguments = st.dictionaries(st.sampled_from(["b", "a", "order_id"]), st.integers() | st.text(max_size=5), max_size=3)
calls = st.builds(ToolCall, id=st.just("c"), name=names, arguments=arguments)
contents = st.none() | st.text(max_size=12)
# A reply that opens with whitespace merges with the generation prompt's "\n" into one BPE
# token, so its rendered ids do not extend the prompt's: the next prefill misses the cache
# from there (a cost, never a change of what the model sees). Generated replies start with text.
reply_contents = st.none() | st.text(max_size=12).filter(lambda t: not t[:1].isspace())
messages = st.one_of(
    st.builds(Message, role=st.just("user"), content=st.text(max_size=12)),
    st.builds(Message, role=st.just("assistant"), content=reply_contents,
              tool_calls=st.lists(calls, max_size=2).map(tuple)),
    st.builds(Message, role=st.just("tool"), content=st.text(max_size=12), tool_call_id=st.just("c")),
    st.builds(Message, role=st.just("system"), content=st.text(max_size=12)),
)


@settings(max_examples=150, deadline=None)
@given(conversation=st.lists(messages, min_size=1, max_size=7), with_tools=st.booleans())
def test_generation_prompt_is_a_prefix_of_the_rendered_reply(tokenizer, conversation, with_tools):
    tools = TOOLS if with_tools else ()
    full = render_prompt(tokenizer, conversation, tools, add_generation_prompt=False)
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    for n, message in enumerate(conversation):
        if message.role == "assistant" and n > 0:  # transformers refuses to render an empty conversation
            prompt = render_prompt(tokenizer, conversation[:n], tools, add_generation_prompt=True)
            assert full.startswith(prompt)
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            assert full_ids[: len(prompt_ids)] == prompt_ids  # the prompt's KV cache is reusable


def test_rendered_prompt_example(tokenizer):
    conversation = [*CHAT, Message("assistant", "Checking.", (ToolCall("call_0", "get_order", {"order_id": "#W1"}),)),
                    Message("tool", '{"status": "shipped"}', tool_call_id="call_0")]
    text = render_prompt(tokenizer, conversation, TOOLS[:1])
    assert text == (
        "<|im_start|>system\nYou are a shop agent.\n\nYou can call these tools:\n<tools>\n"
        '{"name":"get_order","description":"Look up an order by id.","parameters":{"type":"object",'
        '"properties":{"order_id":{"type":"string"}},"required":["order_id"]}}\n</tools>\n'
        "To call a tool, answer with one block per call:\n<tool_call>\n"
        '{"name": <tool-name>, "arguments": <arguments-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhere is order #W1?<|im_end|>\n"
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_order", "arguments": {"order_id":"#W1"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>tool\n<tool_response>\n{"status": "shipped"}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_tools_appear_only_when_offered(tokenizer):
    with_tools = render_prompt(tokenizer, CHAT, TOOLS)
    for tool in TOOLS:
        assert json.dumps(tool.parameters, separators=(",", ":")) in with_tools
        assert f'"name":"{tool.name}"' in with_tools
    assert "<tools>" not in render_prompt(tokenizer, CHAT, ())


def test_default_system_prompt_like_smollm2(tokenizer):
    user_only = [Message("user", "hi")]
    ours = render_prompt(tokenizer, user_only, ())
    assert ours == tokenizer.apply_chat_template([m.to_openai() for m in user_only], tokenize=False,
                                                 add_generation_prompt=True)
    assert ours.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<tools>" in render_prompt(tokenizer, user_only, TOOLS).split("<|im_end|>")[0]


def test_string_and_dict_arguments_render_identically(tokenizer):
    call = ToolCall("c", "get_order", {"z": 1, "a": [1, 2], "é": "ü"})
    as_dict = template_messages([Message("assistant", None, (call,))])
    as_string = [Message("assistant", None, (call,)).to_openai()]  # wire format: JSON string
    # vLLM decodes JSON-string arguments before templating (and so does render_prompt)
    as_string[0]["tool_calls"][0]["function"]["arguments"] = json.loads(
        as_string[0]["tool_calls"][0]["function"]["arguments"])
    render = lambda ms: tokenizer.apply_chat_template(ms, chat_template=load_template(), tokenize=False)
    assert render(as_dict) == render(as_string)
    assert '"arguments": {"a":[1,2],"z":1,"é":"ü"}}' in render(as_dict)


def test_assistant_tokens_are_marked_for_training(tokenizer):
    conversation = [*CHAT, Message("assistant", "Hi.", (ToolCall("c", "get_order", {"order_id": "1"}),))]
    out = tokenizer.apply_chat_template(template_messages(conversation), chat_template=load_template(),
                                        tools=[t.to_openai() for t in TOOLS], return_dict=True,
                                        return_assistant_tokens_mask=True)
    marked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tokenizer.decode(marked) == (
        'Hi.\n<tool_call>\n{"name": "get_order", "arguments": {"order_id":"1"}}\n</tool_call><|im_end|>')


# --- the engine -------------------------------------------------------------------------


def request(text: str, max_tokens: int = 6, **kw) -> ChatRequest:
    return ChatRequest(messages=[*CHAT[:1], Message("user", text)], tools=TOOLS, max_tokens=max_tokens, **kw)


def reference_generate(model, tokenizer, req: ChatRequest) -> list[int]:
    """transformers' own greedy generate on one unpadded prompt: the ids our engine must match."""
    ids = tokenizer(render_prompt(tokenizer, req.messages, req.tools), return_tensors="pt",
                    add_special_tokens=False)["input_ids"]
    out = model.generate(ids, max_new_tokens=req.max_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


def test_batch_matches_unbatched_generate_and_counts_tokens(tokenizer):
    model = tiny_llama(tokenizer)
    engine = TransformersEngine.from_model(model, tokenizer, batch_size=3)
    assert isinstance(engine, ChatEngine)
    reqs = [request("a", 5), request("a much longer question about an order that was lost", 7), request("b c", 3)]
    completions = engine.chat(reqs)
    for req, completion in zip(reqs, completions):
        expected = reference_generate(model, tokenizer, req)
        prompt = tokenizer(render_prompt(tokenizer, req.messages, req.tools), add_special_tokens=False)["input_ids"]
        assert completion.usage.prompt_tokens == len(prompt)
        assert completion.usage.completion_tokens == len(expected) == req.max_tokens
        assert completion.text == tokenizer.decode(expected)
        assert completion.finish_reason == "length"
        assert completion.usage.cached_tokens == 0 and completion.usage.seconds > 0


def test_stop_token_ends_a_row_and_is_counted(tokenizer):
    model = tiny_llama(tokenizer)
    word = tokenizer("Hello", add_special_tokens=False)["input_ids"]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    handle = force_tokens(model, [*word, im_end])
    try:
        short, stopping = TransformersEngine.from_model(model, tokenizer).chat([request("x", len(word)),
                                                                                request("y z", 10)])
    finally:
        handle.remove()
    assert (short.finish_reason, short.usage.completion_tokens, short.text) == ("length", len(word), "Hello")
    assert (stopping.finish_reason, stopping.usage.completion_tokens, stopping.text) == ("stop", len(word) + 1, "Hello")
    assert stopping.message == Message("assistant", "Hello") and stopping.malformed is None


def test_generated_tool_call_is_parsed(tokenizer):
    model = tiny_llama(tokenizer)
    text = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "#W1"}}\n</tool_call>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    force_tokens(model, ids)
    bad = ChatRequest(messages=CHAT, tools=TOOLS[1:], max_tokens=len(ids))  # get_order not offered
    good, malformed = TransformersEngine.from_model(model, tokenizer).chat([request("q", len(ids)), bad])
    assert good.text == text and good.malformed is None
    assert good.message.tool_calls == (ToolCall("call_0", "get_order", {"order_id": "#W1"}),)
    assert "unknown tool 'get_order'" in malformed.malformed and malformed.message.tool_calls == ()


def test_greedy_is_deterministic_and_sampling_follows_the_seed(tokenizer):
    model = tiny_llama(tokenizer)
    reqs = [request("hello", 8), request("hello there", 8)]
    greedy = TransformersEngine.from_model(model, tokenizer)
    assert [c.text for c in greedy.chat(reqs)] == [c.text for c in greedy.chat(reqs)]
    sampled = lambda seed: [c.text for c in TransformersEngine.from_model(model, tokenizer, temperature=1.0,
                                                                          seed=seed).chat(reqs)]
    assert sampled(1) == sampled(1)
    assert sampled(1) != sampled(2)


def test_adapters_switch_by_name(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(tiny_llama(tokenizer), LoraConfig(r=4, lora_alpha=16, init_lora_weights=False,
                                                            target_modules=["q_proj", "v_proj", "down_proj"]))
    lora.save_pretrained(tmp_path / "tuned")
    base_model = tiny_llama(tokenizer)
    base_text = tokenizer.decode(reference_generate(base_model, tokenizer, request("q", 8)))
    tuned_text = tokenizer.decode(reference_generate(lora, tokenizer, request("q", 8)))
    assert tuned_text != base_text
    engine = TransformersEngine.from_model(base_model, tokenizer, adapters={"tuned": str(tmp_path / "tuned")})
    reqs = [request("q", 8, adapter="tuned"), request("q", 8), request("q", 8, adapter="tuned")]
    assert [c.text for c in engine.chat(reqs)] == [tuned_text, base_text, tuned_text]
    with pytest.raises(EngineError, match="unknown adapter 'nope'"):
        engine.chat([request("q", 2), request("q", 2, adapter="nope")])


def test_context_length_exceeded(tokenizer):
    engine = TransformersEngine.from_model(tiny_llama(tokenizer), tokenizer, max_model_len=64)
    prompt = render_prompt(tokenizer, [Message("user", "hi")], ())
    prompt_len = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    fits = ChatRequest(messages=[Message("user", "hi")], max_tokens=64 - prompt_len)
    assert engine.chat([fits])[0].usage.completion_tokens <= 64 - prompt_len
    with pytest.raises(ContextLengthExceeded, match=f"prompt of {prompt_len} tokens \\+ max_tokens 65"):
        engine.chat([fits, ChatRequest(messages=[Message("user", "hi")], max_tokens=65)])


def test_cost(tokenizer):
    model = tiny_llama(tokenizer)
    cost = TransformersEngine.from_model(model, tokenizer).cost
    assert cost.weight_bytes == 4 * sum(p.numel() for p in model.parameters())
    assert cost.kv_bytes_per_token == 2 * 2 * 1 * 8 * 4  # K and V, 2 layers, 1 kv head of dim 8, float32


@pytest.mark.slow
def test_smollm2_answers_a_chat_with_a_tool(tokenizer, monkeypatch):
    """Real SmolLM2, batched (left padding, KV cache): each reply is a greedy decode of the
    model, i.e. every generated token is the argmax of the unpadded model's next-token
    distribution there (within float noise: no exact ids, they differ across CPUs), and
    its accounting and text are exactly the ids generated."""
    engine = TransformersEngine("smollm2", max_model_len=2048)
    reqs = [ChatRequest(messages=[Message("user", "Where is my order #W1?")], tools=TOOLS[:1], max_tokens=40),
            ChatRequest(messages=[Message("user", "Say hello.")], max_tokens=12)]
    generated, generate = [], engine._generate

    def spy(prompts, max_new, *below):
        out = generate(prompts, max_new, *below)
        generated.extend(zip(prompts, out))
        return out

    monkeypatch.setattr(engine, "_generate", spy)
    began = time.perf_counter()
    completions = engine.chat(reqs)
    wall = time.perf_counter() - began
    assert len(generated) == 2
    for req, completion in zip(reqs, completions):
        prompt = tokenizer(render_prompt(tokenizer, req.messages, req.tools), add_special_tokens=False)["input_ids"]
        [gen] = [g for p, g in generated if p == prompt]  # the engine decoded from exactly this prompt
        assert completion.usage.prompt_tokens == len(prompt)
        assert completion.usage.completion_tokens == len(gen.ids) <= req.max_tokens
        assert completion.finish_reason == ("stop" if gen.stopped else "length")
        assert gen.stopped or len(gen.ids) == req.max_tokens
        assert completion.text == tokenizer.decode(gen.ids[:-1] if gen.stopped else gen.ids)
        assert (completion.message, completion.malformed) == parse_assistant_text(completion.text, req.tools)
        with torch.inference_mode():
            logits = engine.model(input_ids=torch.tensor([prompt + gen.ids])).logits[0, len(prompt) - 1 : -1].float()
        logprobs = logits.log_softmax(-1)
        chosen = logprobs[torch.arange(len(gen.ids)), torch.tensor(gen.ids)]
        assert (logprobs.max(-1).values - chosen).max().item() < 1e-3  # greedy, token by token
    assert "<tools>" in render_prompt(tokenizer, reqs[0].messages, reqs[0].tools)
    assert sum(c.usage.seconds for c in completions) == pytest.approx(wall, rel=0.2)
    assert engine.cost.weight_bytes == 4 * sum(p.numel() for p in engine.model.parameters())


@pytest.mark.vllm
def test_vllm_hermes_parser_reads_rendered_calls(tokenizer):
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    calls = (ToolCall("a", "get_order", {"order_id": "#W1", "n": 2}), ToolCall("b", "cancel_order", {}))
    conversation = [Message("user", "q"), Message("assistant", "Checking.", calls)]
    full = render_prompt(tokenizer, conversation, TOOLS, add_generation_prompt=False)
    reply = full.removeprefix(render_prompt(tokenizer, conversation[:1], TOOLS)).removesuffix("<|im_end|>\n")
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}],
                                    tools=[t.to_openai() for t in TOOLS])
    parsed = Hermes2ProToolParser(tokenizer).extract_tool_calls(reply, request)
    assert parsed.tools_called and parsed.content.strip() == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls] == [
        (c.name, c.arguments) for c in calls]
    ours, malformed = parse_assistant_text(reply, [*TOOLS[:1], ToolSpec("cancel_order", "", {"type": "object"})])
    assert malformed is None
    assert [(c.name, c.arguments) for c in ours.tool_calls] == [(c.name, c.arguments) for c in calls]
