"""The OpenAI-compatible engine: against scripted stdlib HTTP servers (fast), and against a
real vLLM server on SmolLM2 (slow, one server per session, tests/conftest.py)."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specagent.core.errors import ConfigError, ContextLengthExceeded, EngineError, EngineUnavailable
from specagent.core.interfaces import ChatEngine, ChatRequest, ModelCost, ScoreRequest, TokenScorer
from specagent.core.types import DraftedStep, Message, Segment, StepKind, ToolCall
from specagent.engines.openai_engine import OpenAIEngine, chat_completions_url, completions_url
from specagent.engines.render import load_template, profile_named
from specagent.engines.vllm_server import free_port, start_server
from tests.conftest import ADAPTER, WEATHER, need_vllm, weather_chat

ASK = [Message("system", "You are a weather assistant."), Message("user", "Weather in Paris?")]


def reply(content: str | None = None, tool_calls: list | None = None, usage: dict | None = None,
          finish_reason: str = "stop") -> dict[str, Any]:
    """A chat-completions response body as an OpenAI-compatible server sends it."""
    message = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": usage or {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "call_abc", "type": "function", "function": {"name": name, "arguments": arguments}}


class FakeServer:
    """An HTTP server on 127.0.0.1 that answers POSTs with scripted (status, body) pairs
    (the last one repeats) and records each request's path, JSON body and headers."""

    def __init__(self, answers: list[tuple[int, Any]], delay_s: float = 0.0) -> None:
        self.answers = list(answers)
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append(body)
                    fake.headers.append(dict(self.headers))
                    fake.paths.append(self.path)
                    status, answer = fake.answers.pop(0) if len(fake.answers) > 1 else fake.answers[0]
                time.sleep(fake.delay_s)
                data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep test output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def engine_for(server: FakeServer, **kwargs) -> OpenAIEngine:
    return OpenAIEngine(server.url, "remote-model", **{"backoff_s": 0.01, "timeout_s": 5, **kwargs})


# --- scripted servers: the wire format ----------------------------------------------------


def test_request_carries_messages_tools_and_settings(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    history = [*ASK, Message("assistant", None, tool_calls=(ToolCall("c1", "get_weather", {"city": "Paris"}),)),
               Message("tool", "12C", tool_call_id="c1")]
    with FakeServer([(200, reply("It is 12C."))]) as server:
        engine = engine_for(server, seed=3, extra_body={"top_k": 1})
        engine.chat([ChatRequest(history, (WEATHER,), max_tokens=33, adapter="drafter-lora")])
    [body], [headers] = server.requests, server.headers
    assert body["model"] == "drafter-lora"  # an adapter is a served model name
    assert body["messages"] == [m.to_openai() for m in history]
    assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert body["tools"] == [WEATHER.to_openai()] and body["tool_choice"] == "auto"
    assert (body["max_tokens"], body["temperature"], body["seed"], body["top_k"]) == (33, 0.0, 3, 1)
    assert headers["Authorization"] == "Bearer sk-test"


def test_no_tools_means_no_tool_choice_and_no_key_means_no_auth_header(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeServer([(200, reply("hi"))]) as server:
        engine_for(server).chat([ChatRequest(ASK)])
    assert "tools" not in server.requests[0] and "tool_choice" not in server.requests[0]
    assert "Authorization" not in server.headers[0]


@pytest.mark.parametrize("base", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/chat/completions"])
def test_base_url_may_or_may_not_end_in_v1(base):
    assert chat_completions_url(base) == "http://h:1/v1/chat/completions"
    assert completions_url(base) == "http://h:1/v1/completions"


def test_structured_tool_call_and_usage_with_cached_tokens():
    usage = {"prompt_tokens": 120, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 96}}
    answer = reply(None, [call("get_weather", '{"city": "Paris"}')], usage, finish_reason="tool_calls")
    with FakeServer([(200, answer)]) as server:
        engine = engine_for(server, cost=ModelCost(weight_bytes=10, kv_bytes_per_token=2))
        [done] = engine.chat([ChatRequest(ASK, (WEATHER,))])
    assert isinstance(engine, ChatEngine) and engine.cost.weight_bytes == 10
    assert done.malformed is None and done.finish_reason == "tool_calls"
    assert done.message.tool_calls == (ToolCall("call_abc", "get_weather", {"city": "Paris"}),)
    assert (done.usage.prompt_tokens, done.usage.cached_tokens, done.usage.completion_tokens) == (120, 96, 9)
    assert done.text == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    "tool_call, reason",
    [
        (call("get_weather", '{"city": "Par'), "cannot be decoded"),  # invalid JSON
        (call("get_weather", '["Paris"]'), "must be a JSON object"),
        (call("launch_rocket", '{"city": "Paris"}'), "unknown tool 'launch_rocket'"),
        (call("get_weather", '{"town": "Paris"}'), "'city' is a required property"),
        (call("get_weather", '{"city": 7}'), "fail its schema"),
    ],
)
def test_bad_tool_calls_are_malformed_completions_not_exceptions(tool_call, reason):
    with FakeServer([(200, reply("Let me look.", [tool_call]))]) as server:
        [done] = engine_for(server).chat([ChatRequest(ASK, (WEATHER,))])
    assert reason in done.malformed
    assert done.message.tool_calls == () and done.message.content == "Let me look."
    assert done.usage.completion_tokens == 7


def test_tool_call_in_text_is_parsed_when_the_server_does_not():
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    with FakeServer([(200, reply(text))]) as server:
        [done] = engine_for(server).chat([ChatRequest(ASK, (WEATHER,))])
    assert done.malformed is None and done.text == text
    assert [(c.name, c.arguments) for c in done.message.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert done.message.content == "Checking."


def test_requests_of_one_call_run_concurrently():
    with FakeServer([(200, reply("ok"))], delay_s=0.4) as server:
        began = time.perf_counter()
        done = engine_for(server).chat([ChatRequest(ASK)] * 4)
        elapsed = time.perf_counter() - began
    assert len(server.requests) == 4 and [d.text for d in done] == ["ok"] * 4
    assert elapsed < 1.2  # one after another would take 1.6 s
    assert sum(d.usage.seconds for d in done) == pytest.approx(elapsed, rel=0.2)  # wall time counted once


# --- scripted servers: failures -------------------------------------------------------------


def test_retries_5xx_then_succeeds():
    failing = (500, {"error": {"message": "engine hiccup"}})
    with FakeServer([failing, failing, (200, reply("fine"))]) as server:
        [done] = engine_for(server, max_retries=3).chat([ChatRequest(ASK)])
    assert done.text == "fine" and len(server.requests) == 3


def test_usage_counts_what_crossed_the_network_retries_included():
    failing, fine = (500, {"error": {"message": "engine hiccup"}}), (200, reply("fine"))
    with FakeServer([failing, fine]) as server:
        [done] = engine_for(server).chat([ChatRequest(ASK, (WEATHER,))])
    sent = sum(int(headers["Content-Length"]) for headers in server.headers)
    received = sum(len(json.dumps(body).encode()) for _, body in (failing, fine))
    assert (done.usage.requests, done.usage.bytes_sent, done.usage.bytes_received) == (2, sent, received)
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (11, 7)  # from the answer only


def test_429_is_retried_and_persistent_5xx_gives_up_with_the_server_message():
    with FakeServer([(429, {"error": {"message": "slow down"}}), (200, reply("fine"))]) as server:
        assert engine_for(server).chat([ChatRequest(ASK)])[0].text == "fine"
    with FakeServer([(503, {"error": {"message": "overloaded"}})]) as server:
        with pytest.raises(EngineError, match="503 after 3 attempts: overloaded") as err:
            engine_for(server, max_retries=2).chat([ChatRequest(ASK)])
    assert not isinstance(err.value, EngineUnavailable) and len(server.requests) == 3


def test_4xx_is_not_retried_and_raises_with_the_server_message():
    with FakeServer([(404, {"error": {"message": "The model `remote-model` does not exist."}})]) as server:
        with pytest.raises(EngineError, match="404: The model `remote-model` does not exist"):
            engine_for(server).chat([ChatRequest(ASK)])
    assert len(server.requests) == 1


def test_context_overflow_from_the_server_is_context_length_exceeded():
    message = "This model's maximum context length is 2048 tokens. However, your prompt contains 3000 input tokens"
    with FakeServer([(400, {"error": {"message": message, "type": "BadRequestError"}})]) as server:
        with pytest.raises(ContextLengthExceeded, match="maximum context length is 2048"):
            engine_for(server).chat([ChatRequest(ASK)])


def test_a_body_that_is_not_json_is_an_engine_error():
    with FakeServer([(200, "<html>proxy error</html>")]) as server:
        with pytest.raises(EngineError, match="not JSON"):
            engine_for(server).chat([ChatRequest(ASK)])


def test_server_down_is_engine_unavailable_quickly_and_names_the_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    engine = OpenAIEngine(url, "m", timeout_s=2, max_retries=2, backoff_s=0.01)
    began = time.perf_counter()
    with pytest.raises(EngineUnavailable, match="down or unreachable") as err:
        engine.chat([ChatRequest(ASK)])
    assert f"{url}/v1/chat/completions" in str(err.value)
    assert time.perf_counter() - began < 2


# --- the served model's own dir: prompt profile and scoring (strong.tokenizer) ------------------


def score_reply(reported: list[dict[int, tuple[float, int]]]) -> dict[str, Any]:
    """A /v1/completions body as vLLM sends it with `prompt_logprobs`: null for the first prompt
    token, then per position {token id as a string: {logprob, rank, decoded_token}}."""
    entries = [None] + [{str(token): {"logprob": logprob, "rank": rank, "decoded_token": f"<{token}>"}
                         for token, (logprob, rank) in entry.items()} for entry in reported]
    tokens = len(entries)  # one entry per prompt token
    return {"id": "cmpl-1", "object": "text_completion", "model": "remote-model",
            "choices": [{"index": 0, "text": "x", "finish_reason": "length", "prompt_logprobs": entries}],
            "usage": {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}}


PROMPT = [10, 11, 12, 13]
# after 10: 11 is the top token; after 11: 12 is third (42 is top); after 12: 13 is the top token
OWN = [{11: (-0.1, 1)}, {12: (-2.0, 3), 42: (-0.5, 1)}, {13: (-0.3, 1)}]


@pytest.fixture(scope="module")
def bare_dir(smollm2_dir, tmp_path_factory) -> str:
    """SmolLM2's tokenizer with the `bare` prompt profile saved beside it: a fine-tuned S's dir
    (tools and policy distilled into the weights)."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("bare-strong")
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(out)
    profile_named("bare").save(out)
    return str(out)


def test_a_bare_profile_sends_no_tools_and_no_policy_and_calls_come_back_as_text(bare_dir):
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    with FakeServer([(200, reply(text))]) as server:
        engine = engine_for(server, tokenizer=bare_dir)
        [done] = engine.chat([ChatRequest(ASK, (WEATHER,))])
    [body] = server.requests
    assert "tools" not in body and "tool_choice" not in body
    assert body["messages"] == [{"role": "system", "content": ""}, ASK[1].to_openai()]
    assert done.malformed is None  # checked against the offered tools, which the prompt did not show
    assert [(c.name, c.arguments) for c in done.message.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert engine.profile_for(None).name == "bare" and engine.tokenizer.chat_template == load_template()


def test_a_dir_without_a_profile_sends_what_no_tokenizer_sends(smollm2_dir, bare_dir):
    """The full profile changes nothing; an adapter given by path has its own dir's profile."""
    request = ChatRequest(ASK, (WEATHER,), max_tokens=9)
    with FakeServer([(200, reply("hi"))]) as server:
        plain = engine_for(server).payload(request)
        full = engine_for(server, tokenizer=smollm2_dir, adapters={"drafter": bare_dir})
        assert full.payload(request) == plain and plain["tools"] == [WEATHER.to_openai()]
        drafted = full.payload(ChatRequest(ASK, (WEATHER,), adapter="drafter"))
        assert "tools" not in drafted and drafted["messages"][0]["content"] == ""
        assert full.profile_for("served-elsewhere").name == "full"  # a name the server knows: the base's


def test_own_scores_are_the_prompt_tokens_log_probs_and_whether_they_are_top(smollm2_dir):
    with FakeServer([(200, score_reply(OWN))]) as server:
        engine = engine_for(server, tokenizer=smollm2_dir)
        [scores] = engine.score([ScoreRequest(PROMPT, [0, 1, 2], own=True)])
    [body] = server.requests
    assert server.paths == ["/v1/completions"]
    assert body == {"model": "remote-model", "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    assert scores.logprobs == [[-0.1, 1.0], [-2.0, 0.0], [-0.3, 1.0]] and scores.estimated == 0
    usage = scores.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (4, 0)  # the sampled token is discarded
    received = len(json.dumps(score_reply(OWN)).encode())
    assert (usage.requests, usage.bytes_sent, usage.bytes_received) == (1, int(server.headers[0]["Content-Length"]),
                                                                      received)


def test_candidate_scores_read_the_top_k_and_bound_the_ones_outside_it(smollm2_dir):
    reported = [{11: (-0.1, 1)}, {7: (-0.2, 1), 12: (-1.5, 2), 9: (-4.0, 20)}, {13: (-0.3, 1)}]
    answer = {k: v for k, v in score_reply(reported).items() if k != "usage"}  # a server that reports none
    with FakeServer([(200, answer)]) as server:
        engine = engine_for(server, tokenizer=smollm2_dir)
        [scores] = engine.score([ScoreRequest(PROMPT, [1], candidates=(7, 8), adapter="verdict-head")])
    body = server.requests[0]
    assert (body["model"], body["prompt_logprobs"]) == ("verdict-head", 20)
    assert scores.logprobs == [[-0.2, -4.0]] and scores.estimated == 1  # 8 is not reported: the k-th log-prob
    assert (scores.usage.prompt_tokens, scores.usage.completion_tokens) == (len(PROMPT), 0)  # counted here


def test_likelihood_verdict_through_the_server_under_the_served_profile(bare_dir):
    """The verify prompt is rendered here under the served model's profile, sent as token ids,
    and each step is scored from the server's prompt log-probs: the first step all greedy (1.0),
    one token of the second at p = 0.3 and not the top one."""
    from specagent.engines.verdict_likelihood import LikelihoodVerifier

    call = Message("assistant", None, tool_calls=(ToolCall("c1", "get_weather", {"city": "Paris"}),))
    steps = (DraftedStep(call, StepKind.READ, (Message("tool", "Paris: 20C", tool_call_id="c1", name="get_weather"),)),
             DraftedStep(Message("assistant", "It is 20C in Paris."), StepKind.REPLY))
    with FakeServer([(200, reply("unused"))]) as server:
        engine = engine_for(server, tokenizer=bare_dir)
        ids, spans = LikelihoodVerifier(engine).prompt(ASK, (WEATHER,), steps)
    off = spans[1][0] + 2  # a token inside the second step
    reported = [{ids[t]: (-0.01, 1)} if t != off else {ids[t]: (math.log(0.3), 2), 0: (math.log(0.6), 1)}
                for t in range(1, len(ids))]
    with FakeServer([(200, score_reply(reported))]) as server:
        engine = engine_for(server, tokenizer=bare_dir)
        verdict, [(role, usage)] = LikelihoodVerifier(engine).verify(ASK, (WEATHER,), Segment(len(ASK), steps, "held"))
        lenient, _ = LikelihoodVerifier(engine, threshold=0.25).verify(ASK, (WEATHER,), Segment(len(ASK), steps, "held"))
    assert server.requests[0]["prompt"] == ids and server.requests[0]["prompt_logprobs"] == 0
    assert verdict.scores == pytest.approx((1.0, 0.3)) and verdict.accepted == 1 and lenient.accepted == 2
    assert role == "strong" and usage.prompt_tokens == len(ids) and usage.completion_tokens == 0
    shown = engine.tokenizer.decode(ids)
    assert "<tools>" not in shown and "weather assistant" not in shown  # bare: neither tools nor policy


def test_scoring_retries_429_and_maps_context_overflow_as_chat_does(smollm2_dir):
    with FakeServer([(429, {"error": {"message": "slow down"}}), (200, score_reply(OWN))]) as server:
        [scores] = engine_for(server, tokenizer=smollm2_dir).score([ScoreRequest(PROMPT, [0], own=True)])
    assert scores.logprobs == [[-0.1, 1.0]] and scores.usage.requests == 2 and len(server.requests) == 2
    message = "This model's maximum context length is 2048 tokens. However, you requested 3001 tokens"
    with FakeServer([(400, {"error": {"message": message, "type": "BadRequestError"}})]) as server:
        engine = engine_for(server, tokenizer=smollm2_dir)
        with pytest.raises(ContextLengthExceeded, match="v1/completions: This model's maximum context length"):
            engine.score([ScoreRequest(PROMPT, [0], own=True)])
    assert len(server.requests) == 1  # a client error is not retried


def test_score_requests_of_one_call_run_concurrently(smollm2_dir):
    with FakeServer([(200, score_reply(OWN))], delay_s=0.4) as server:
        engine = engine_for(server, tokenizer=smollm2_dir)
        began = time.perf_counter()
        done = engine.score([ScoreRequest(PROMPT, [0, 2], own=True)] * 3)
        elapsed = time.perf_counter() - began
    assert [d.logprobs for d in done] == [[[-0.1, 1.0], [-0.3, 1.0]]] * 3 and len(server.requests) == 3
    assert elapsed < 1.0  # one after another would take 1.2 s


def test_scoring_without_the_models_dir_or_prompt_logprobs_says_what_is_missing(smollm2_dir):
    with FakeServer([(200, reply("a chat reply, no prompt_logprobs"))]) as server:
        engine = engine_for(server)
        assert isinstance(engine, TokenScorer)  # the protocol only sees attributes: the config check guards
        with pytest.raises(EngineError, match="strong.tokenizer"):
            engine.score([ScoreRequest(PROMPT, [0], own=True)])
        scorer = engine_for(server, tokenizer=smollm2_dir)
        with pytest.raises(EngineError, match="prompt_logprobs"):
            scorer.score([ScoreRequest(PROMPT, [0], own=True)])
        with pytest.raises(EngineError, match="followed by a prompt token"):
            scorer.score([ScoreRequest(PROMPT, [3], own=True)])


def test_the_config_builds_it_and_the_likelihood_verdict_needs_the_tokenizer(bare_dir):
    from specagent.config import RuntimeSpec
    from specagent.engines import build_engine
    from specagent.runtime.assembly import plan_models

    strong = {"backend": "openai", "model": "s", "base_url": "http://127.0.0.1:9/v1"}
    spec = RuntimeSpec.model_validate({"env": {"name": "store"}, "strong": {**strong, "tokenizer": bare_dir},
                                       "verifier": {"kind": "likelihood"}})
    assert plan_models(spec, ("specagent",)).wants_verifier
    with build_engine(spec.strong) as engine:
        assert engine.profile_for(None).name == "bare" and engine.tokenizer is not None
    without = spec.model_copy(update={"strong": spec.strong.model_copy(update={"tokenizer": None})})
    with pytest.raises(ConfigError, match="set strong.tokenizer to the served model's local dir"):
        plan_models(without, ("specagent",))


# --- a real vLLM server on SmolLM2 -------------------------------------------------------------


@pytest.fixture(scope="module")
def served(vllm_server):
    engine = OpenAIEngine(vllm_server.base_url, vllm_server.model, timeout_s=120, max_retries=1)
    yield engine
    engine.close()


@pytest.mark.slow
@pytest.mark.vllm
def test_real_server_chat_with_tools_returns_a_message_and_usage(served):
    requests = [ChatRequest(ASK, (WEATHER,), max_tokens=16), ChatRequest(ASK[1:], (WEATHER,), max_tokens=16)]
    for done in served.chat(requests):
        # what SmolLM2 says differs across CPUs; whatever it is arrives as one assistant message
        assert done.message.role == "assistant" and (done.message.content or done.message.tool_calls or done.malformed)
        assert {c.name for c in done.message.tool_calls} <= {"get_weather"}  # a call names the offered tool
        assert done.malformed is None or done.message.tool_calls == ()  # a bad call is reported, never run
        assert done.usage.prompt_tokens > 60  # the tools block is in the prompt
        assert 0 < done.usage.completion_tokens <= 16
        assert done.finish_reason in ("stop", "length", "tool_calls")
        assert done.finish_reason != "length" or done.usage.completion_tokens == 16
        assert done.usage.requests == 1 and done.usage.bytes_sent > 0 and done.usage.bytes_received > 0


@pytest.mark.slow
@pytest.mark.vllm
def test_real_server_tool_call_round_trip(served, smollm2_dir):
    """A structured call comes back from the server's hermes parser, and the history with its
    result goes back in (the server renders it as specagent does). No exact arguments or
    answer: greedy outputs differ across CPUs."""
    from transformers import AutoTokenizer

    from specagent.engines.render import render_prompt

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt_tokens = lambda chat: len(tokenizer(render_prompt(tokenizer, chat, (WEATHER,)), add_special_tokens=False)["input_ids"])
    chat = weather_chat("Paris")
    [first] = served.chat([ChatRequest(chat, (WEATHER,), max_tokens=48)])
    assert first.malformed is None
    [tool_call] = first.message.tool_calls  # structured, from vLLM's hermes parser
    assert tool_call.name == "get_weather" and isinstance(tool_call.arguments.get("city"), str)  # fits the schema
    assert tool_call.id  # the server's id, echoed back below
    assert first.usage.prompt_tokens == prompt_tokens(chat)

    chat += [first.message, Message("tool", "Paris: 12C, rainy", tool_call_id=tool_call.id)]
    [second] = served.chat([ChatRequest(chat, (WEATHER,), max_tokens=48)])
    assert second.usage.prompt_tokens == prompt_tokens(chat)  # the call and its result, rendered as ours
    assert 0 < second.usage.completion_tokens <= 48
    assert second.usage.cached_tokens > 0  # the first prompt's blocks, from the server's prefix cache


@pytest.mark.slow
@pytest.mark.vllm
def test_real_server_serves_the_adapter_by_name(served):
    """The adapter changes the output; the base request beside it is the base request alone."""
    chat = [Message("user", "What is the capital of France?")]
    [alone] = served.chat([ChatRequest(chat, max_tokens=12)])
    base, tuned = served.chat([ChatRequest(chat, max_tokens=12), ChatRequest(chat, max_tokens=12, adapter=ADAPTER)])
    assert base.text == alone.text  # the concurrent adapter request leaves the base request alone
    assert tuned.text != base.text
    assert all(0 < done.usage.completion_tokens <= 12 for done in (alone, base, tuned))


@pytest.mark.slow
@pytest.mark.vllm
def test_real_server_context_overflow_and_unknown_model(served, vllm_server):
    with pytest.raises(ContextLengthExceeded):
        served.chat([ChatRequest([Message("user", "word " * 2100)], max_tokens=8)])
    with pytest.raises(EngineError, match="404"):
        OpenAIEngine(vllm_server.base_url, "no-such-model", max_retries=0).chat([ChatRequest(ASK, max_tokens=4)])


@pytest.mark.slow
@pytest.mark.vllm
def test_server_that_dies_while_starting_says_why_in_one_line(tmp_path):
    need_vllm()
    missing = tmp_path / "no-model-here"
    with pytest.raises(EngineError, match="exited with code") as err:
        start_server(str(missing), timeout_s=120, log_path=tmp_path / "broken.log")
    message = str(err.value)
    assert len(message.splitlines()) == 1  # the cause and the log's path, not the log
    assert re.search(r"exited with code \d+: \w+(Error|Exception): .*no-model-here", message)  # the log's root error
    assert "broken.log" in message
