"""The OpenAI-compatible engine: against scripted stdlib HTTP servers (fast), and against a
real vLLM server on SmolLM2 (slow, one server per session, tests/conftest.py)."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specagent.core.errors import ContextLengthExceeded, EngineError, EngineUnavailable
from specagent.core.interfaces import ChatEngine, ChatRequest, ModelCost
from specagent.core.types import Message, ToolCall
from specagent.engines.openai_engine import OpenAIEngine, chat_completions_url
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
    (the last one repeats) and records each request's JSON body and headers."""

    def __init__(self, answers: list[tuple[int, Any]], delay_s: float = 0.0) -> None:
        self.answers = list(answers)
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append(body)
                    fake.headers.append(dict(self.headers))
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
