"""Errors the protocol knows how to handle. Everything else is a bug."""


class SpecAgentError(Exception):
    """Base class: a problem with a clear message for the user, no traceback needed."""


class EngineError(SpecAgentError):
    """A model backend failed (server down, engine died, request refused)."""


class EngineUnavailable(EngineError):
    """The engine cannot be reached at all (connection refused, process gone)."""


class ContextLengthExceeded(EngineError):
    """The prompt does not fit the model's context window; the episode ends there."""


class ConfigError(SpecAgentError):
    """A configuration problem; the message lists every problem found."""


class TaskFileError(SpecAgentError):
    """A task/trajectory file could not be read; the message names file and line."""
