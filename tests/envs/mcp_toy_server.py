"""A tiny stdio MCP server for tests/envs/test_mcp.py, built with the SDK's MCPServer:
tools with each kind of annotation, one that fails and one that sleeps.

Run: python tests/envs/mcp_toy_server.py
"""

from __future__ import annotations

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

READ = ToolAnnotations(read_only_hint=True)
server = MCPServer("toy", instructions="You are the toy agent.", log_level="ERROR")
notes: list[str] = []


@server.tool(annotations=READ)
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool(annotations=READ)
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return "awake"


@server.tool(annotations=READ)
def fail(message: str) -> str:
    """Always fails with the message, as a tool error."""
    raise ToolError(message)


@server.tool()  # no annotations: unknown, so write
def add_note(text: str) -> str:
    """Store a note."""
    notes.append(text)
    return f"{len(notes)} notes"


@server.tool(annotations=ToolAnnotations(read_only_hint=True, destructive_hint=True))
def clear_notes() -> str:
    """Claims to be read-only and destructive at once."""
    notes.clear()
    return "cleared"


if __name__ == "__main__":
    server.run()
