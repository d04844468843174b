"""Sessions with MCP servers through the official SDK, behind a synchronous facade.

The Environment protocol is synchronous and the SDK is async: ``McpClients`` runs one
asyncio loop on a daemon thread and keeps one session per server open from its
construction to ``close``. Each session lives in a task of its own, because the SDK's
context managers must be left by the task that entered them; calls run as separate
tasks on the same loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import sys
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Protocol, TextIO, TypeVar

import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client

from specagent.core.errors import ConfigError
from specagent.core.types import ToolSpec

logger = logging.getLogger(__name__)

class McpServer(Protocol):
    """How to reach one MCP server (the `env.mcp.servers` entries of a config satisfy it): a
    stdio ``command`` (argv) or a streamable-HTTP ``url``."""

    name: str
    command: list[str] | None
    url: str | None
    env: Mapping[str, str]
    restart_each_task: bool


CONNECT_TIMEOUT_S = 60.0  # starting a stdio server may import a lot on a busy machine
CLOSE_TIMEOUT_S = 15.0  # the SDK gives a stdio server a few seconds to exit before killing it
CALL_GRACE_S = 5.0  # beyond the tool timeout, in case the transport itself hangs
T = TypeVar("T")


def declared_read_only(annotations: types.ToolAnnotations | Mapping[str, Any] | None) -> bool | None:
    """What a server says about a tool: True (read-only), False (write) or None (nothing).

    Takes the SDK's model or raw JSON, with ``readOnlyHint`` or ``read_only_hint`` (SDKs
    and serializations differ). Only a literal true is read-only, and a tool that claims
    to be read-only and destructive at once is taken as write.
    """
    if annotations is None:
        return None
    if not isinstance(annotations, Mapping):
        annotations = annotations.model_dump(by_alias=True, exclude_none=True)
    read_only = annotations.get("readOnlyHint", annotations.get("read_only_hint"))
    if read_only is None:
        return None
    destructive = annotations.get("destructiveHint", annotations.get("destructive_hint"))
    return read_only is True and destructive is not True


def tool_spec(tool: types.Tool) -> ToolSpec:
    return ToolSpec(tool.name, tool.description or "", tool.input_schema, declared_read_only(tool.annotations))


def result_text(result: types.CallToolResult) -> str:
    """The observation of a tool result: its text blocks (other blocks named by type), or
    its structured content as JSON when it has no content blocks."""
    if not result.content and result.structured_content is not None:
        return json.dumps(result.structured_content, sort_keys=True)
    return "\n".join(b.text if isinstance(b, types.TextContent) else f"[{b.type} content]" for b in result.content)


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: ours, when it is a real file. In a notebook, or
    under output capture, `sys.stderr` has no file descriptor for the subprocess to write
    to, so the process's own stderr is used (else the null device)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.fileno()
            return stream
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            continue
    return open(os.devnull, "w")  # noqa: SIM115 - lives as long as the server


def _target(settings: McpServer) -> Any:
    """What `Client` connects to: the URL, or the stdio transport of the command."""
    if settings.url is not None:
        return settings.url
    program, *args = settings.command or []
    program = sys.executable if program == "python" else program
    return stdio_client(StdioServerParameters(command=program, args=args, env=settings.env or None), errlog=_errlog())


def _root_cause(err: BaseException) -> BaseException:
    """The first real error inside the SDK's task-group exception groups (duck-typed:
    Python 3.10 has no built-in BaseExceptionGroup)."""
    while getattr(err, "exceptions", None):
        err = err.exceptions[0]  # type: ignore[attr-defined]
    return err


class _Session:
    """One server's session, held open by its own task until ``close``."""

    def __init__(self, settings: McpServer) -> None:
        self.settings = settings
        self.client: Client | None = None
        self.tools: list[types.Tool] = []
        self.instructions: str | None = None
        self.used = False  # a tool was called since the session opened
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._stop.clear()
        self.used = False
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready))
        await ready

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            async with Client(_target(self.settings)) as client:
                self.tools = await _list_tools(client)
                self.instructions = client.instructions
                self.client = client
                ready.set_result(None)
                await self._stop.wait()
        except Exception as err:
            if not ready.done():
                ready.set_exception(_root_cause(err))
            else:
                logger.warning("MCP server %r: the session ended: %s", self.settings.name, _root_cause(err))
        finally:
            self.client = None

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> tuple[str, bool]:
        """(observation, ok). Error results, protocol errors and timeouts are observations."""
        if self.client is None:
            return f"Error: MCP server {self.settings.name!r} is not connected", False
        self.used = True
        try:
            result = await self.client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except MCPError as err:
            if err.code == types.REQUEST_TIMEOUT:
                return f"Error: tool {name} timed out after {timeout:g}s", False
            return f"Error: tool {name} failed: {err.message}", False
        except Exception as err:  # a broken server is an observation, never a crash of the episode
            err = _root_cause(err)
            return f"Error: tool {name} failed: {type(err).__name__}: {err}", False
        text = result_text(result)
        return (f"Error: {text}", False) if result.is_error else (text, True)


async def _list_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            return tools


class McpClients:
    """Open sessions with the servers, in the given order, on a background event loop."""

    def __init__(self, servers: Sequence[McpServer]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="specagent-mcp", daemon=True)
        self._thread.start()
        self.sessions: dict[str, _Session] = {}
        try:
            for settings in servers:
                self.sessions[settings.name] = _Session(settings)
                self._open(self.sessions[settings.name])
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def _open(self, session: _Session) -> None:
        settings = session.settings
        server = f"MCP server {settings.name!r} ({' '.join(settings.command) if settings.command else settings.url})"
        try:
            self._run(session.open(), CONNECT_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            raise ConfigError(f"{server}: no session after {CONNECT_TIMEOUT_S:g}s") from None
        except Exception as err:
            raise ConfigError(f"{server}: cannot connect: {type(err).__name__}: {err}") from None

    def instructions(self) -> str:
        """The servers' instructions, joined (empty when none has any)."""
        return "\n\n".join(s.instructions for s in self.sessions.values() if s.instructions)

    def call(self, server: str, name: str, arguments: dict[str, Any], timeout: float) -> tuple[str, bool]:
        """Call ``name`` on ``server``: (observation, ok). Never raises."""
        try:
            return self._run(self.sessions[server].call(name, arguments, timeout), timeout + CALL_GRACE_S)
        except concurrent.futures.TimeoutError:
            return f"Error: tool {name} timed out after {timeout:g}s", False

    def restart_used(self) -> None:
        """A fresh process for each server with ``restart_each_task`` that was called since it started."""
        for session in self.sessions.values():
            if session.settings.restart_each_task and session.used:
                self._run(session.close(), CLOSE_TIMEOUT_S)
                self._open(session)

    def close(self) -> None:
        """End every session (stdio servers exit) and stop the loop. Safe to call twice."""
        if self._loop.is_closed():
            return
        for session in self.sessions.values():
            try:
                self._run(session.close(), CLOSE_TIMEOUT_S)
            except Exception as err:  # closing the others matters more than this one's error
                logger.warning("MCP server %r: close failed: %s", session.settings.name, err)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)
        self._loop.close()
