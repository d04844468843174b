"""The tau-bench airline domain, live, over data the user points at (not shipped)."""

from __future__ import annotations

from specagent.envs.airline.data import data_hash
from specagent.envs.airline.env import AirlineEnv, ticket_request
from specagent.envs.airline.tools import TOOL_SPECS, run_tool

__all__ = ["TOOL_SPECS", "AirlineEnv", "data_hash", "run_tool", "ticket_request"]
