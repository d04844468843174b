"""The tau-bench airline domain, live, over data the user points at (not shipped)."""

from __future__ import annotations

from specagent.config import EnvConfig
from specagent.core.errors import ConfigError
from specagent.envs.airline.data import data_hash
from specagent.envs.airline.env import AirlineEnv, ticket_request
from specagent.envs.airline.tools import TOOL_SPECS, run_tool

__all__ = ["TOOL_SPECS", "AirlineEnv", "data_hash", "env_from_config", "run_tool", "ticket_request"]


def env_from_config(cfg: EnvConfig) -> AirlineEnv:
    """The environment of ``env: {name: airline, airline: {data_dir, runs, user}}``."""
    settings = cfg.airline
    if settings is None:
        raise ConfigError("env.airline: `name: airline` needs `airline: {data_dir: DIR}` "
                          "(the tau-bench airline data: flights.json, reservations.json, users.json, runs)")
    if cfg.tasks_path:
        raise ConfigError("env.tasks_path: the airline tasks come from the runs file; set env.airline.runs instead")
    user_engine = None
    if settings.user == "simulated":
        from specagent.engines import build_engine

        try:
            user_engine = build_engine(settings.user_model)
        except ValueError as err:  # e.g. the scripted backend, which has no policy to play a user
            raise ConfigError(f"env.airline.user_model: {err}") from None
    return AirlineEnv(settings.data_dir, settings.runs, user=settings.user, user_engine=user_engine)
