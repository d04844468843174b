"""`specagent serve`: the runtime over HTTP (FastAPI on uvicorn).

    POST /v1/episodes          {task_id, mode?}: one episode; its episodes.jsonl record
    POST /v1/chat/completions  OpenAI-compatible: the agent's next message to the user;
                               `conversation_id` (returned under `specagent`) continues a chat
    GET  /metrics              counters since start (Prometheus text; ?format=json)
    GET  /health

Episodes and chat turns run on a pool of episode workers (one at a time on the engines'
lock), outside the server's event loop: /health and /metrics are answered by the loop
itself, at once, however busy the workers are. Every request body is checked before it is
parsed into a request: at most `max_request_bytes`, JSON without NaN or Infinity. With
`api_key_env` set, every request but /health must carry `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Literal, Optional

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from specagent.config import ServeConfig
from specagent.core.errors import EngineError, SpecAgentError
from specagent.core.protocol import Mode
from specagent.core.types import Message
from specagent.serve.service import (
    BadHistory,
    HistoryMismatch,
    ModeNotAllowed,
    Service,
    UnknownConversation,
    UnknownTask,
    chat_completion,
)

STATUS = {UnknownTask: 404, UnknownConversation: 404, HistoryMismatch: 409, BadHistory: 400, ModeNotAllowed: 403}


class EpisodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str
    mode: Mode = "specagent"


class ChatMessage(BaseModel):
    """One OpenAI chat message (text content)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None


class ChatCompletionRequest(BaseModel):
    """The OpenAI request body. Sampling fields (temperature, ...) are accepted and ignored:
    the engines' configuration decides; the environment's tools replace any `tools`."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(min_length=1)
    model: Optional[str] = None
    task_id: Optional[str] = None  # specagent extension: the task whose fresh state a new chat starts from
    conversation_id: Optional[str] = None  # specagent extension: the chat to continue (from the last reply)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def body_problem(body: bytes, limit: int) -> tuple[int, str] | None:
    """(status, message) for a request body the service refuses before parsing it, or None."""
    if len(body) > limit:
        return 413, f"request body of {len(body)} bytes exceeds max_request_bytes ({limit})"
    if not body:
        return None
    try:
        json.loads(body, parse_constant=_no_constants)
    except ValueError as err:  # NaN/Infinity, or not JSON at all (FastAPI would say 422 for the latter)
        if "JSON number" in str(err):
            return 400, f"request body: {err}"
    return None


def exposure_warning(cfg: ServeConfig) -> str | None:
    """A loud warning for a server reachable beyond this machine with no auth."""
    if cfg.api_key_env:
        return None
    try:
        loopback = cfg.host == "localhost" or ipaddress.ip_address(cfg.host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (f"WARNING: specagent serve binds {cfg.host}:{cfg.port}, beyond loopback, WITHOUT authentication: anyone "
            "who reaches it can run episodes and chat turns that execute tool calls. Set api_key_env (the name of "
            "an environment variable holding a bearer token) or bind 127.0.0.1.")


def create_app(service: Service, workers: int = 1) -> FastAPI:
    app = FastAPI(title="specagent", summary="SpecAgent: a weak model drafts, a strong model reviews.")
    cfg = service.cfg
    api_key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else None
    if cfg.api_key_env and not api_key:
        raise SpecAgentError(f"api_key_env: the environment variable {cfg.api_key_env} is empty or unset")
    episodes_pool = ThreadPoolExecutor(workers, thread_name_prefix="episode")
    pending = threading.BoundedSemaphore(cfg.max_pending)
    app.router.on_shutdown.append(lambda: episodes_pool.shutdown(wait=False, cancel_futures=True))

    async def on_worker(fn: Callable[[], Any]) -> Any:
        """Run an episode or chat turn on the episode workers; 503 when too many are waiting."""
        if not pending.acquire(blocking=False):
            raise HTTPException(503, f"busy: {cfg.max_pending} requests already queued or running; retry later")
        try:
            return await asyncio.get_running_loop().run_in_executor(episodes_pool, fn)
        finally:
            pending.release()

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _error(401, "missing or wrong bearer token (Authorization: Bearer <key>)", "Unauthorized")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cfg.max_request_bytes:
            return _error(413, f"request body of {declared} bytes exceeds max_request_bytes ({cfg.max_request_bytes})",
                          "RequestTooLarge")
        if request.method == "POST":
            problem = body_problem(await request.body(), cfg.max_request_bytes)
            if problem:
                return _error(problem[0], problem[1], "BadRequestBody")
        return await call_next(request)

    @app.exception_handler(SpecAgentError)
    def _refused(request: Request, err: SpecAgentError) -> JSONResponse:
        status = next((code for kind, code in STATUS.items() if isinstance(err, kind)),
                      502 if isinstance(err, EngineError) else 500)
        return _error(status, str(err), type(err).__name__)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/episodes")
    async def episodes(body: EpisodeRequest) -> dict[str, Any]:
        return await on_worker(lambda: service.run_episode(body.task_id, body.mode))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> dict[str, Any]:
        try:
            messages = [Message.from_openai(m.model_dump(exclude_none=True)) for m in body.messages]
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # a tool call without a name, bad arguments
            raise HTTPException(400, f"messages: a tool call cannot be read ({type(err).__name__}: {err})") from None
        turn = await on_worker(lambda: service.chat(messages, body.task_id, body.conversation_id))
        return chat_completion(turn, body.model or service.model_names["strong"])

    @app.get("/metrics")
    async def metrics(format: Literal["prometheus", "json"] = "prometheus") -> Any:
        if format == "json":
            return service.metrics.to_json()
        return Response(service.metrics.prometheus(), media_type=CONTENT_TYPE_LATEST)

    return app


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def serve(cfg: ServeConfig) -> None:
    """Build the engines, serve until SIGINT or SIGTERM, then close the engines."""
    warning = exposure_warning(cfg)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    service = Service(cfg)
    try:
        server = uvicorn.Server(uvicorn.Config(create_app(service), host=cfg.host, port=cfg.port))
        with _signals_stop(server):
            server.run()
    finally:
        service.close()


@contextlib.contextmanager
def _signals_stop(server: uvicorn.Server) -> Iterator[None]:
    """SIGINT and SIGTERM ask the server to stop. uvicorn handles them while it runs, and
    after its graceful shutdown re-raises them to the handler it replaced: this one, so a
    signal is a clean stop (engines closed, exit code 0) rather than a kill."""

    def stop(signum: int, frame: Any) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
