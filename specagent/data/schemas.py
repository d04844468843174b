"""Tool schemas for imported logs: inferred from the recorded calls, overridden from YAML.

Most logs carry no tool schemas (the tau-bench result files, many chat exports). The
drafter still needs them in its prompt and the protocol needs them to validate drafted
calls, so they are inferred from every call seen across an import:

- one tool per called name; one property per argument name;
- each value's JSON type (string, integer, number, boolean, array, object, null); several
  types give a list (``["string", "null"]``); integers seen next to floats are ``number``;
- arrays get an ``items`` schema and objects ``properties``, inferred the same way;
- an argument present in every call (a key present in every object) is ``required``;
- ``read_only`` is None: the log does not say, so the protocol treats the tool as write.

A tools file (YAML) supplies what a log cannot::

    read_only: [get_user_details, search_direct_flight]   # executed while drafting
    write: [book_reservation]                             # held for the verifier
    tools:                                                # OpenAI function specs
      - type: function
        function: {name: list_all_airports, description: ..., parameters: {...}}

Explicit specs replace inferred ones of the same name, and are added when no call used
them; the lists then set each tool's ``read_only`` flag (the user's word beats the log's).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specagent.core.types import ToolCall, ToolSpec

# JSON types in the order they are listed in a union.
_TYPE_ORDER = ("string", "integer", "number", "boolean", "array", "object", "null")


def json_type(value: Any) -> str:
    """The JSON Schema type name of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


@dataclass
class _Shape:
    """What was observed at one position of a JSON value, across all observations."""

    seen: int = 0
    types: set[str] = field(default_factory=set)
    properties: dict[str, "_Shape"] = field(default_factory=dict)  # insertion order = first seen
    objects: int = 0  # how many observations were objects (for `required`)
    items: Optional["_Shape"] = None

    def observe(self, value: Any) -> None:
        self.seen += 1
        kind = json_type(value)
        self.types.add(kind)
        if kind == "object":
            self.objects += 1
            for key, sub in value.items():
                self.properties.setdefault(str(key), _Shape()).observe(sub)
        elif kind == "array":
            if self.items is None:
                self.items = _Shape()
            for element in value:
                self.items.observe(element)

    def schema(self) -> dict[str, Any]:
        types = set(self.types)
        if {"integer", "number"} <= types:
            types.discard("integer")  # every integer is a JSON number
        ordered = [t for t in _TYPE_ORDER if t in types]
        out: dict[str, Any] = {}
        if ordered:
            out["type"] = ordered[0] if len(ordered) == 1 else ordered
        if "object" in types:
            out["properties"] = {name: sub.schema() for name, sub in self.properties.items()}
            required = [name for name, sub in self.properties.items() if sub.seen == self.objects]
            if required:
                out["required"] = required
        if "array" in types and self.items is not None and self.items.seen:
            out["items"] = self.items.schema()
        return out


def infer_tool_specs(calls: Iterable[ToolCall]) -> list[ToolSpec]:
    """One inferred ``ToolSpec`` per tool name, in the order the names were first called."""
    shapes: dict[str, _Shape] = {}
    for call in calls:
        shapes.setdefault(call.name, _Shape()).observe(dict(call.arguments))
    specs = []
    for name, shape in shapes.items():
        parameters = shape.schema()
        parameters["type"] = "object"
        parameters.setdefault("properties", {})
        specs.append(
            ToolSpec(
                name=name,
                description=f"(schema inferred from {shape.seen} recorded call{'s' * (shape.seen != 1)})",
                parameters=parameters,
                read_only=None,
            )
        )
    return specs


# ---------------------------------------------------------------- the tools file (YAML)


class _FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: Optional[bool] = None  # allowed by the OpenAI format; not used

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            jsonschema.validators.validator_for(value).check_schema(value)
        except jsonschema.exceptions.SchemaError as exc:
            raise ValueError(f"not a valid JSON schema: {exc.message}") from None
        if value.get("type", "object") != "object":
            raise ValueError("the parameters schema must have type 'object'")
        return value


class _ToolEntry(BaseModel):
    """An OpenAI tool (``{type: function, function: {...}}``) or the bare function spec."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"] = "function"
    function: _FunctionSpec
    read_only: Optional[bool] = None

    @model_validator(mode="before")
    @classmethod
    def _bare_form(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "function" not in raw and "name" in raw:
            raw = dict(raw)
            raw["function"] = {k: raw.pop(k) for k in ("name", "description", "parameters", "strict") if k in raw}
        return raw

    def to_spec(self) -> ToolSpec:
        fn = self.function
        return ToolSpec(name=fn.name, description=fn.description, parameters=fn.parameters, read_only=self.read_only)


class ToolsFile(BaseModel):
    """The schema of a tools file: explicit specs and the user's read-only / write lists."""

    model_config = ConfigDict(extra="forbid")

    read_only: list[str] = Field(default_factory=list)
    write: list[str] = Field(default_factory=list)
    tools: list[_ToolEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "ToolsFile":
        both = sorted(set(self.read_only) & set(self.write))
        if both:
            raise ValueError(f"tools listed in both read_only and write: {', '.join(both)}")
        names = [entry.to_spec().name for entry in self.tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tools given more than once: {', '.join(twice)}")
        return self


@dataclass(frozen=True)
class ToolsOverride:
    """A loaded tools file: specs that replace inferred ones, and the read-only/write lists."""

    tools: tuple[ToolSpec, ...] = ()
    read_only: frozenset[str] = frozenset()
    write: frozenset[str] = frozenset()
    path: str = ""

    def names(self) -> set[str]:
        return {t.name for t in self.tools} | set(self.read_only) | set(self.write)


def load_tools_file(path: str | Path) -> ToolsOverride:
    """Read and validate a tools YAML file; every problem raises one ``ConfigError``."""
    from specagent.config import load_config  # the shared YAML -> pydantic loader

    parsed = load_config(ToolsFile, path)
    return ToolsOverride(
        tools=tuple(entry.to_spec() for entry in parsed.tools),
        read_only=frozenset(parsed.read_only),
        write=frozenset(parsed.write),
        path=str(path),
    )


def apply_override(specs: Iterable[ToolSpec], override: ToolsOverride | None) -> list[ToolSpec]:
    """Explicit specs replace same-named ones (others are appended), then the lists set read_only."""
    specs = list(specs)
    if override is None:
        return specs
    explicit = {t.name: t for t in override.tools}
    merged = [explicit.pop(t.name, t) for t in specs] + list(explicit.values())
    if not (override.read_only or override.write):
        return merged
    return [_flagged(t, override) for t in merged]


def _flagged(spec: ToolSpec, override: ToolsOverride) -> ToolSpec:
    if spec.name in override.write:
        return replace(spec, read_only=False)
    if spec.name in override.read_only:
        return replace(spec, read_only=True)
    return spec
