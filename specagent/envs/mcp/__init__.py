"""Environments whose tools live behind MCP servers (stdio or streamable HTTP), and the
built-in store domain served as an MCP server. Needs the `mcp` extra."""

from specagent.envs.mcp.env import McpEnv, load_tasks

__all__ = ["McpEnv", "load_tasks"]
