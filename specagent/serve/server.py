"""`specagent serve`: the runtime over HTTP (FastAPI on uvicorn).

    POST /v1/episodes          {task_id, mode?}: one episode; its episodes.jsonl record
    POST /v1/chat/completions  OpenAI-compatible: the agent's next message to the user
    GET  /metrics              counters since start (Prometheus text; ?format=json)
    GET  /health

Endpoints are plain functions, so FastAPI runs them in its thread pool: /health and
/metrics answer while an episode runs; episodes and chat turns queue on the engines' lock.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Iterator, Literal, Optional

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from specagent.config import ServeConfig
from specagent.core.errors import EngineError, SpecAgentError
from specagent.core.types import Message
from specagent.serve.service import Service, UnknownTask, chat_completion

Mode = Literal["strong", "weak", "stepwise", "specagent"]


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
    task_id: Optional[str] = None  # specagent extension: the task whose fresh state the chat starts from


def create_app(service: Service) -> FastAPI:
    app = FastAPI(title="specagent", summary="SpecAgent: a weak model drafts, a strong model reviews.")

    @app.exception_handler(SpecAgentError)
    def _error(request: Request, err: SpecAgentError) -> JSONResponse:
        status = 404 if isinstance(err, UnknownTask) else 502 if isinstance(err, EngineError) else 500
        return JSONResponse({"error": {"message": str(err), "type": type(err).__name__}}, status_code=status)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/episodes")
    def episodes(body: EpisodeRequest) -> dict[str, Any]:
        return service.run_episode(body.task_id, body.mode)

    @app.post("/v1/chat/completions")
    def chat_completions(body: ChatCompletionRequest) -> dict[str, Any]:
        try:
            messages = [Message.from_openai(m.model_dump(exclude_none=True)) for m in body.messages]
        except (KeyError, TypeError, ValueError) as err:  # tool calls without a name, arguments not JSON
            raise HTTPException(400, f"messages: a tool call cannot be read ({type(err).__name__}: {err})") from None
        turn = service.chat(messages, body.task_id)
        return chat_completion(turn, body.model or service.model_names["strong"])

    @app.get("/metrics")
    def metrics(format: Literal["prometheus", "json"] = "prometheus") -> Any:
        if format == "json":
            return service.metrics.to_json()
        return Response(service.metrics.prometheus(), media_type=CONTENT_TYPE_LATEST)

    return app


def serve(cfg: ServeConfig) -> None:
    """Build the engines, serve until SIGINT or SIGTERM, then close the engines."""
    service = Service(cfg)
    try:
        server = uvicorn.Server(uvicorn.Config(create_app(service), host=cfg.host, port=cfg.port))
        with _signals_stop(server):
            server.run()
    finally:
        service.close()


@contextmanager
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
