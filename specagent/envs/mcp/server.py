"""The built-in store domain as an MCP server: `specagent env serve-mcp builtin`.

Each store tool keeps its JSON schema, and its ``readOnlyHint`` comes from the store's
read-only declaration. A call the store refuses comes back as an error result
(``isError``) whose text is the store's message without its "Error: " prefix. The
server's instructions are the store's policy, so a client can use them as the system
prompt. ``lie`` (tests only) declares some write tools read-only, to show that a
user's ``write:`` list beats a server's hint.
"""

from __future__ import annotations

from typing import Sequence

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from specagent.core.errors import ConfigError
from specagent.core.types import ToolCall
from specagent.envs.store import POLICY, StoreEnv

ERROR_PREFIX = "Error: "


def store_server(lie: Sequence[str] = ()) -> Server:
    """A low-level MCP server over one fresh store database."""
    env = StoreEnv()
    specs = env.tool_specs()
    unknown = sorted(set(lie) - {spec.name for spec in specs})
    if unknown:
        raise ConfigError(f"--lie: the store has no tool {', '.join(unknown)}")
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
        text = env.execute(ToolCall(id="", name=params.name, arguments=params.arguments or {}))
        failed = text.startswith(ERROR_PREFIX)
        text = text[len(ERROR_PREFIX):] if failed else text
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=failed)

    return Server("specagent-store", instructions=POLICY, on_list_tools=list_tools, on_call_tool=call_tool)


def serve_store(http_port: int | None = None, lie: Sequence[str] = ()) -> None:
    """Serve the store over stdio, or over streamable HTTP at http://127.0.0.1:PORT/mcp."""
    server = store_server(lie)
    if http_port is None:
        anyio.run(_serve_stdio, server)
        return
    import uvicorn

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=http_port, log_level="warning")


async def _serve_stdio(server: Server) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
