"""A ChatEngine on any OpenAI-compatible chat-completions server (vLLM's, a cloud API).

Plain httpx, no SDK. Tool calls come back structured (`tool_calls`) from servers that
parse them, or as hermes `<tool_call>` text from servers that do not; both end up as
the same `Message`, and a call that cannot be executed is a `malformed` completion,
never an exception. Requests of one `chat` call run concurrently: servers batch them.
The engine knows it is remote: each `Usage` carries the HTTP requests and body bytes
of its call, which the ledger reports as what crossed the network (edge–cloud).
"""

from __future__ import annotations

import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Sequence

import httpx

from specagent.core.errors import ContextLengthExceeded, EngineError, EngineUnavailable
from specagent.core.interfaces import ChatRequest, Completion, ModelCost
from specagent.core.toolcalls import TOOL_CALL_OPEN, parse_assistant_text, validate_message
from specagent.core.types import Message, ToolCall, Usage

API_KEY_ENV = "OPENAI_API_KEY"
RETRY_STATUS = {408, 429}  # plus every 5xx
CONTEXT_MARKERS = ("context length", "context_length", "context window", "maximum context", "too many tokens")
JSON_HEADERS = {"Content-Type": "application/json"}


class OpenAIEngine:
    """Chat with tools through POST {base_url}/v1/chat/completions.

    `base_url` is the server root (``http://127.0.0.1:8000``) or its ``/v1`` URL.
    `api_key` defaults to the ``OPENAI_API_KEY`` environment variable (none is fine for
    a local server). `ChatRequest.adapter`, when set, is sent as the model name: vLLM
    serves each `--lora-modules` adapter under its own name. `cost` is what the caller
    knows about the remote model; the bytes of a remote model are unknown (zeros).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        temperature: float = 0.0,
        seed: int | None = None,
        extra_body: dict[str, Any] | None = None,
        model_name: str | None = None,
        cost: ModelCost = ModelCost(weight_bytes=0, kv_bytes_per_token=0),
        max_concurrency: int = 16,
        backoff_s: float = 0.5,
    ) -> None:
        self.url = chat_completions_url(base_url)
        self.model = model
        self.model_name = model_name or model
        self.cost = cost
        self.temperature = temperature
        self.seed = seed
        self.extra_body = dict(extra_body or {})
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.backoff_s = backoff_s
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def chat(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Answer every request; they are in flight together so the server can batch them."""
        if len(requests) <= 1:
            return [self._one(r) for r in requests]
        began = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(len(requests), self.max_concurrency)) as pool:
            completions = list(pool.map(self._one, requests))
        # Wall time is shared by the batch, as in the local engines: the role totals sum to it.
        share = (time.perf_counter() - began) / len(requests)
        return [replace(c, usage=replace(c.usage, seconds=share)) for c in completions]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "OpenAIEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def payload(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body of one chat-completions request."""
        body: dict[str, Any] = {
            "model": request.adapter or self.model,
            "messages": [m.to_openai() for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": self.temperature,
        }
        if request.tools:
            body["tools"] = [t.to_openai() for t in request.tools]
            body["tool_choice"] = "auto"
        if self.seed is not None:
            body["seed"] = self.seed
        return {**body, **self.extra_body}

    def _one(self, request: ChatRequest) -> Completion:
        began = time.perf_counter()
        reply, traffic = self._post(self.payload(request))
        completion = completion_from_reply(reply, request, time.perf_counter() - began)
        return replace(completion, usage=replace(completion.usage, **traffic))

    def _post(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
        """POST with retries (exponential backoff) on connection errors, timeouts, 429 and 5xx.

        Returns the reply and its traffic: the requests the server answered (retries included)
        and the body bytes both ways, as transferred."""
        content = json.dumps(body, separators=(",", ":")).encode()
        traffic = {"requests": 0, "bytes_sent": 0, "bytes_received": 0}
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self._client.post(self.url, content=content, headers=JSON_HEADERS)
            except httpx.TransportError as exc:
                if last:
                    raise self._transport_error(exc) from exc
                self._sleep(attempt)
                continue
            traffic["requests"] += 1
            traffic["bytes_sent"] += len(content)
            traffic["bytes_received"] += response.num_bytes_downloaded
            if response.status_code < 400:
                return _json(response, self.url), traffic
            if response.status_code in RETRY_STATUS or response.status_code >= 500:
                if last:
                    raise EngineError(f"{self.url} answered {response.status_code} after {attempt + 1} attempts: "
                                      f"{_server_message(response)}")
                self._sleep(attempt, response.headers.get("retry-after"))
                continue
            raise _client_error(response, self.url)
        raise AssertionError("unreachable")

    def _transport_error(self, exc: httpx.TransportError) -> EngineError:
        tries = f"{self.max_retries + 1} attempts"
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            return EngineError(f"{self.url} did not answer within the timeout ({tries}): {exc!r}; "
                               "raise timeout_s for long generations")
        return EngineUnavailable(f"cannot reach {self.url}: the server is down or unreachable "
                                 f"({type(exc).__name__}: {exc}; {tries})")

    def _sleep(self, attempt: int, retry_after: str | None = None) -> None:
        delay = self.backoff_s * 2**attempt * (1 + 0.25 * random.random())
        if retry_after and retry_after.replace(".", "", 1).isdigit():
            delay = max(delay, min(float(retry_after), 60.0))
        time.sleep(delay)


def chat_completions_url(base_url: str) -> str:
    """``.../v1/chat/completions`` for a server root or a ``/v1`` base URL."""
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/chat/completions"


def completion_from_reply(reply: dict[str, Any], request: ChatRequest, seconds: float) -> Completion:
    """A Completion from a chat-completions JSON reply; bad tool calls become `malformed`."""
    try:
        choice = reply["choices"][0]
        raw = choice.get("message") or {}
    except (KeyError, IndexError, TypeError) as exc:
        raise EngineError(f"reply has no choices[0].message: {json.dumps(reply)[:300]}") from exc
    content = raw.get("content")
    raw_calls = raw.get("tool_calls") or []
    if raw_calls:
        message, malformed = _structured_message(content, raw_calls, request)
        text = "\n".join([content] * bool(content) + [_call_text(c) for c in raw_calls])
    else:
        text = content or ""
        message, malformed = parse_assistant_text(text, request.tools)
    return Completion(text=text, message=message, usage=usage_from_reply(reply, seconds), malformed=malformed,
                      finish_reason=choice.get("finish_reason") or "stop")


def _structured_message(content: str | None, raw_calls: list[Any], request: ChatRequest) -> tuple[Message, str | None]:
    plain = Message(role="assistant", content=content or None)
    calls = []
    for index, raw in enumerate(raw_calls):
        try:
            calls.append(ToolCall.from_openai(raw))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            return plain, f"tool call {index} cannot be decoded ({type(exc).__name__}: {str(exc)[:200]})"
        if not isinstance(calls[-1].arguments, dict):
            return plain, f"arguments of {calls[-1].name} must be a JSON object"
    message = Message(role="assistant", content=content or None, tool_calls=tuple(calls))
    problem = validate_message(message, request.tools)
    return (plain, problem) if problem else (message, None)


def _call_text(raw: Any) -> str:
    """A structured call written back the hermes way, so `text` reads like the model's output."""
    fn = raw.get("function") if isinstance(raw, dict) else None
    fn = fn if isinstance(fn, dict) else {}
    arguments = fn.get("arguments") or "{}"
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(fn.get("name"))}, "arguments": {arguments}}}\n</tool_call>'


def usage_from_reply(reply: dict[str, Any], seconds: float) -> Usage:
    usage = reply.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        seconds=seconds,
    )


def _json(response: httpx.Response, url: str) -> dict[str, Any]:
    try:
        return response.json()
    except ValueError as exc:
        raise EngineError(f"{url} answered {response.status_code} with a body that is not JSON: "
                          f"{response.text[:300]!r}") from exc


def _server_message(response: httpx.Response) -> str:
    """The error message of an OpenAI-style error body, or the raw body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)[:500]
    return str(error)[:500]


def _client_error(response: httpx.Response, url: str) -> EngineError:
    message = _server_message(response)
    if response.status_code in (400, 413) and any(m in message.lower() for m in CONTEXT_MARKERS):
        return ContextLengthExceeded(f"{url}: {message}")
    hint = " (check api_key or the OPENAI_API_KEY variable)" if response.status_code in (401, 403) else ""
    return EngineError(f"{url} refused the request with {response.status_code}: {message}{hint}")
