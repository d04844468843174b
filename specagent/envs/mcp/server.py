"""A built-in domain's tools as an MCP server: `specagent env serve-mcp builtin|airline`.

``builtin`` is the store; ``airline`` is tau-bench's airline tools over the user's copy of
its database (``--data-dir``), the stand-in for "your own server" in docs/own-domain.md.
Each tool keeps its JSON schema, and its ``readOnlyHint`` comes from the domain's
read-only declaration. A call the domain refuses comes back as an error result
(``isError``) whose text is the domain's message without its "Error: " prefix. The store
server's instructions are the store's policy, so a client can use them as the system
prompt (the airline server has none: its policy is the task's ``system``). ``lie`` (tests
only) declares some write tools read-only, to show that a user's ``write:`` list beats a
server's hint. One server process holds one database: restart it per task
(``restart_each_task``) for a fresh one.
"""

from __future__ import annotations

from typing import Callable, Sequence

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from specagent.core.errors import ConfigError
from specagent.core.types import ToolCall, ToolSpec
from specagent.envs.store import POLICY, StoreEnv

ERROR_PREFIX = "Error: "


def tools_server(name: str, specs: Sequence[ToolSpec], execute: Callable[[ToolCall], str],
                 instructions: str | None = None, lie: Sequence[str] = ()) -> Server:
    """A low-level MCP server over ``specs``, each call answered by ``execute``."""
    unknown = sorted(set(lie) - {spec.name for spec in specs})
    if unknown:
        raise ConfigError(f"--lie: the {name} domain has no tool {', '.join(unknown)}")
    tools = [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.parameters,
            annotations=types.ToolAnnotations(read_only_hint=bool(spec.read_only) or spec.name in lie),
        )
        for spec in specs
    ]

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = execute(ToolCall(id="", name=params.name, arguments=params.arguments or {}))
        failed = text.startswith(ERROR_PREFIX)
        text = text[len(ERROR_PREFIX):] if failed else text
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=failed)

    return Server(f"specagent-{name}", instructions=instructions, on_list_tools=list_tools, on_call_tool=call_tool)


def store_server(lie: Sequence[str] = ()) -> Server:
    """The store's tools over one fresh store database."""
    env = StoreEnv()
    return tools_server("store", env.tool_specs(), env.execute, POLICY, lie)


def airline_server(data_dir: str, lie: Sequence[str] = ()) -> Server:
    """tau-bench's airline tools over one fresh copy of the database in ``data_dir``."""
    from specagent.envs.airline.data import load_airline_data
    from specagent.envs.airline.tools import TOOL_SPECS, run_tool

    db = load_airline_data(data_dir).fresh_db()
    return tools_server("airline", TOOL_SPECS, lambda call: run_tool(db, call.name, call.arguments), lie=lie)


def serve(server: Server, http_port: int | None = None) -> None:
    """Serve over stdio, or over streamable HTTP at http://127.0.0.1:PORT/mcp."""
    if http_port is None:
        anyio.run(_serve_stdio, server)
        return
    import uvicorn

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=http_port, log_level="warning")


async def _serve_stdio(server: Server) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
