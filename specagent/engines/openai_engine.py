"""A ChatEngine on any OpenAI-compatible chat-completions server (vLLM's, a cloud API).

Plain httpx, no SDK. Tool calls come back structured (`tool_calls`) from servers that
parse them, or as hermes `<tool_call>` text from servers that do not; both end up as
the same `Message`, and a call that cannot be executed is a `malformed` completion,
never an exception. Requests of one `chat` call run concurrently: servers batch them.
The engine knows it is remote: each `Usage` carries the HTTP requests and body bytes
of its call, which the ledger reports as what crossed the network (edge–cloud).

Given the served model's local dir (`tokenizer`), the engine also knows what the server
runs: chat requests go under the model's prompt profile (a fine-tuned strong model served
with a compact prompt), and `score` reads prompt positions through vLLM's
`/v1/completions` `prompt_logprobs`, so the strong model behind the server can give the
`likelihood` (or `head`) verdict.
"""

from __future__ import annotations

import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Sequence, TypeVar

import httpx

from specagent.core.errors import ContextLengthExceeded, EngineError, EngineUnavailable
from specagent.core.interfaces import ChatRequest, Completion, ModelCost, ScoreRequest, Scores
from specagent.core.toolcalls import TOOL_CALL_OPEN, parse_assistant_text, validate_message
from specagent.core.types import Message, ToolCall, Usage
from specagent.engines.models import materialize
from specagent.engines.render import PromptProfile, load_tokenizer

API_KEY_ENV = "OPENAI_API_KEY"
RETRY_STATUS = {408, 429}  # plus every 5xx
CONTEXT_MARKERS = ("context length", "context_length", "context window", "maximum context", "too many tokens")
JSON_HEADERS = {"Content-Type": "application/json"}
Answer = TypeVar("Answer", Completion, Scores)


class OpenAIEngine:
    """Chat with tools through POST {base_url}/v1/chat/completions.

    `base_url` is the server root (``http://127.0.0.1:8000``) or its ``/v1`` URL.
    `api_key` defaults to the ``OPENAI_API_KEY`` environment variable (none is fine for
    a local server). `ChatRequest.adapter`, when set, is sent as the model name: vLLM
    serves each `--lora-modules` adapter under its own name. `cost` is what the caller
    knows about the remote model; the bytes of a remote model are unknown (zeros).

    `tokenizer`: the served model's local dir (or the `smollm2` alias). With it, every chat
    request is sent under the prompt profile saved there (`profile_for`), and `score` works.
    `adapters` maps served adapter names to their local dirs, for their own prompt profiles.
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
        tokenizer: str | None = None,
        adapters: dict[str, str] | None = None,
    ) -> None:
        self.url = chat_completions_url(base_url)
        self.completions_url = completions_url(base_url)
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
        self.tokenizer_dir = materialize(tokenizer) if tokenizer else None
        self.tokenizer: Any = _load_tokenizer(self.tokenizer_dir) if self.tokenizer_dir else None
        self.profiles = served_profiles(self.tokenizer_dir, adapters or {})
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def chat(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Answer every request; they are in flight together so the server can batch them."""
        return self._each(self._one, requests)

    def score(self, requests: Sequence[ScoreRequest], top_k: int = 20) -> list[Scores]:
        """Log-probabilities at prompt positions, from the server's `prompt_logprobs` (vLLM's
        /v1/completions): one prefill per request, the requests in flight together.

        As on `VLLMEngine.score`'s prompt_logprobs path: an `own` request reads the prompt's own
        next token and its rank (`prompt_logprobs: 0`, since vLLM always reports the prompt's
        token); a candidate request reads the top `top_k`, and a candidate outside them gets the
        lowest reported log-prob, an upper bound counted in `Scores.estimated`. The one token the
        server must sample comes from the prefill's last logits; it is discarded, not counted.
        """
        if self.tokenizer is None:
            raise EngineError(f"{self.model_name}: scoring prompt positions needs the served model's tokenizer; "
                              "set `tokenizer` in its engine config (strong.tokenizer) to the model's local dir")
        for request in requests:
            if any(not 0 <= p < len(request.token_ids) - 1 for p in request.positions):
                raise EngineError("score: a position must be followed by a prompt token (the server reads its "
                                  "distribution there)")
        return self._each(lambda request: self._score_one(request, top_k), requests)

    def profile_for(self, adapter: str | None) -> PromptProfile:
        """The prompt profile requests on `adapter` (None: the base model) are sent and scored with."""
        return self.profiles.get(adapter, self.profiles[None])

    def _each(self, answer: Callable[[Any], Answer], requests: Sequence[Any]) -> list[Answer]:
        """`answer` for every request, all in flight together so the server can batch them."""
        if len(requests) <= 1:
            return [answer(r) for r in requests]
        began = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(len(requests), self.max_concurrency)) as pool:
            answers = list(pool.map(answer, requests))
        # Wall time is shared by the batch, as in the local engines: the role totals sum to it.
        share = (time.perf_counter() - began) / len(requests)
        return [replace(a, usage=replace(a.usage, seconds=share)) for a in answers]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "OpenAIEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def payload(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body of one chat-completions request, under the served model's prompt profile:
        a profile that drops the tools sends none, and the model's hermes text calls are parsed here."""
        messages, tools = self.profile_for(request.adapter).apply(request.messages, request.tools)
        body: dict[str, Any] = {
            "model": request.adapter or self.model,
            "messages": [m.to_openai() for m in messages],
            "max_tokens": request.max_tokens,
            "temperature": self.temperature,
        }
        if tools:
            body["tools"] = [t.to_openai() for t in tools]
            body["tool_choice"] = "auto"
        if self.seed is not None:
            body["seed"] = self.seed
        return {**body, **self.extra_body}

    def _one(self, request: ChatRequest) -> Completion:
        began = time.perf_counter()
        reply, traffic = self._post(self.payload(request))
        completion = completion_from_reply(reply, request, time.perf_counter() - began)
        return replace(completion, usage=replace(completion.usage, **traffic))

    def score_payload(self, request: ScoreRequest, top_k: int = 20) -> dict[str, Any]:
        """The JSON body of one completions request that scores `request`'s prompt."""
        return {"model": request.adapter or self.model, "prompt": list(request.token_ids), "max_tokens": 1,
                "temperature": 0, "prompt_logprobs": 0 if request.own else top_k}

    def _score_one(self, request: ScoreRequest, top_k: int) -> Scores:
        began = time.perf_counter()
        reply, traffic = self._post(self.score_payload(request, top_k), self.completions_url)
        scores = scores_from_reply(reply, request, time.perf_counter() - began)
        return replace(scores, usage=replace(scores.usage, **traffic))

    def _post(self, body: dict[str, Any], url: str | None = None) -> tuple[dict[str, Any], dict[str, int]]:
        """POST to `url` (default: chat completions) with retries (exponential backoff) on
        connection errors, timeouts, 429 and 5xx.

        Returns the reply and its traffic: the requests the server answered (retries included)
        and the body bytes both ways, as transferred."""
        url = url or self.url
        content = json.dumps(body, separators=(",", ":")).encode()
        traffic = {"requests": 0, "bytes_sent": 0, "bytes_received": 0}
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self._client.post(url, content=content, headers=JSON_HEADERS)
            except httpx.TransportError as exc:
                if last:
                    raise self._transport_error(exc, url) from exc
                self._sleep(attempt)
                continue
            traffic["requests"] += 1
            traffic["bytes_sent"] += len(content)
            traffic["bytes_received"] += response.num_bytes_downloaded
            if response.status_code < 400:
                return _json(response, url), traffic
            if response.status_code in RETRY_STATUS or response.status_code >= 500:
                if last:
                    raise EngineError(f"{url} answered {response.status_code} after {attempt + 1} attempts: "
                                      f"{_server_message(response)}")
                self._sleep(attempt, response.headers.get("retry-after"))
                continue
            raise _client_error(response, url)
        raise AssertionError("unreachable")

    def _transport_error(self, exc: httpx.TransportError, url: str) -> EngineError:
        tries = f"{self.max_retries + 1} attempts"
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            return EngineError(f"{url} did not answer within the timeout ({tries}): {exc!r}; "
                               "raise timeout_s for long generations")
        return EngineUnavailable(f"cannot reach {url}: the server is down or unreachable "
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


def completions_url(base_url: str) -> str:
    """``.../v1/completions`` (where `score` asks for prompt log-probs) beside the chat URL."""
    return chat_completions_url(base_url).removesuffix("/chat/completions") + "/completions"


def _load_tokenizer(path: str) -> Any:
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as exc:
        raise EngineError(f"tokenizer {path!r}: no tokenizer there ({type(exc).__name__}: {str(exc)[:200]}); "
                          "set it to the local dir of the model the server serves") from exc


def served_profiles(tokenizer_dir: str | None, adapters: dict[str, str]) -> dict[str | None, PromptProfile]:
    """The prompt profile per served name (None: the base model).

    Without the model's dir the engine knows nothing of the served weights, and every request
    goes as it is (the full profile, as before profiles existed). With it, the base model's
    profile is the one saved there; an adapter the config gives by path (a drafter or verdict
    head registered under a fixed name, which the server must serve under that name) has its
    own saved profile or the base's, as on the local engines. Adapters the server serves under
    names of its own are not known here and get the base's profile."""
    base = PromptProfile.load(tokenizer_dir)
    if tokenizer_dir is None:
        return {None: base}
    own = {name: PromptProfile.load(path) for name, path in adapters.items() if PromptProfile.saved_in(path)}
    return {None: base, **{name: own.get(name, base) for name in adapters}}


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


def scores_from_reply(reply: dict[str, Any], request: ScoreRequest, seconds: float) -> Scores:
    """`Scores` from a completions reply with vLLM's `prompt_logprobs`: per prompt position a
    dict (token id as a string -> logprob, rank), the entry at p + 1 the distribution after p."""
    reported = [_position_entry(reply, p + 1) for p in request.positions]
    usage = usage_from_reply(reply, seconds)
    # the one sampled token comes from the prefill's last logits and is discarded: not decoded
    usage = replace(usage, prompt_tokens=usage.prompt_tokens or len(request.token_ids), completion_tokens=0)
    if request.own:
        own = [_own_token(entry, request.token_ids[p + 1], p) for p, entry in zip(request.positions, reported)]
        return Scores(logprobs=[[float(e["logprob"]), float(e.get("rank") == 1)] for e in own], usage=usage)
    return Scores(logprobs=[_candidate_logprobs(entry, request.candidates) for entry in reported], usage=usage,
                  estimated=sum(c not in entry for entry in reported for c in request.candidates))


def _position_entry(reply: dict[str, Any], index: int) -> dict[int, dict[str, Any]]:
    """The reported log-probs at prompt position `index`, keyed by token id."""
    try:
        entry = reply["choices"][0]["prompt_logprobs"][index]
        return {int(token): value for token, value in entry.items()}
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise EngineError(f"reply has no choices[0].prompt_logprobs[{index}] (scoring needs a server that "
                          f"reports prompt_logprobs, as vLLM does): {json.dumps(reply)[:300]}") from exc


def _own_token(entry: dict[int, dict[str, Any]], token: int, position: int) -> dict[str, Any]:
    if token not in entry:
        raise EngineError(f"the server's prompt_logprobs after position {position} lack the prompt's own token {token}")
    return entry[token]


def _candidate_logprobs(entry: dict[int, dict[str, Any]], candidates: Sequence[int]) -> list[float]:
    floor = min(float(value["logprob"]) for value in entry.values())
    return [float(entry[c]["logprob"]) if c in entry else floor for c in candidates]


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
