"""Schema inference from recorded calls, and the tools file that overrides it."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.errors import ConfigError
from specagent.core.types import ToolCall, ToolSpec
from specagent.data.schemas import ToolsOverride, apply_override, infer_tool_specs, load_tools_file
from tests.data.conftest import ROOT

IMPORT_CONFIGS = sorted((ROOT / "configs" / "import").glob("*.yaml"))


def calls(name: str, *argument_sets: dict) -> list[ToolCall]:
    return [ToolCall(id=f"c{i}", name=name, arguments=a) for i, a in enumerate(argument_sets)]


def test_types_unions_and_required():
    observed = calls(
        "f",
        {"s": "x", "n": 1, "flag": True, "maybe": None, "tags": ["a"], "opt": 3},
        {"s": "y", "n": 2.5, "flag": False, "maybe": "m", "tags": []},
    ) + calls("g", {})
    f, g = infer_tool_specs(observed)
    assert (f.name, g.name, f.read_only) == ("f", "g", None)
    assert f.parameters == {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "n": {"type": "number"},  # integer and float seen: every integer is a number
            "flag": {"type": "boolean"},
            "maybe": {"type": ["string", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "opt": {"type": "integer"},
        },
        "required": ["s", "n", "flag", "maybe", "tags"],
    }
    assert g.parameters == {"type": "object", "properties": {}}
    assert f.description == "(schema inferred from 2 recorded calls)"


def test_nested_objects_and_mixed_arrays():
    (spec,) = infer_tool_specs(calls(
        "h",
        {"items": [{"id": 1, "qty": 2}, {"id": 2}], "extra": {"a": [1, "x"]}},
        {"items": [{"id": 3, "note": "n"}], "extra": "plain"},
    ))
    props = spec.parameters["properties"]
    assert props["items"] == {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "qty": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["id"],
        },
    }
    assert props["extra"] == {
        "type": ["string", "object"],
        "properties": {"a": {"type": "array", "items": {"type": ["string", "integer"]}}},
        "required": ["a"],
    }


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("uvwxyz"), JSON, max_size=4), min_size=1, max_size=5))
def test_inferred_schema_accepts_every_observed_call(argument_sets):
    (spec,) = infer_tool_specs(calls("t", *argument_sets))
    jsonschema.Draft202012Validator.check_schema(spec.parameters)
    for arguments in argument_sets:
        jsonschema.validate(arguments, spec.parameters)


@pytest.mark.parametrize("path", IMPORT_CONFIGS, ids=lambda p: p.name)
def test_shipped_tools_files_validate(path):
    override = load_tools_file(path)
    assert override.read_only and override.write and not (override.read_only & override.write)
    named = {t.name for t in override.tools}
    assert named <= override.read_only | override.write  # every explicit tool is classified


def test_tools_file_problems_are_reported_together(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "read_only: [a, b]\nwrite: [b]\nsurprise: 1\n"
        "tools:\n  - {name: a, parameters: {type: object, properties: {x: {type: strng}}}}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_tools_file(path)
    text = str(err.value)
    assert str(path) in text and "surprise" in text and "strng" in text
    both = tmp_path / "both.yaml"
    both.write_text("read_only: [a, b]\nwrite: [b]\n")
    with pytest.raises(ConfigError, match="both read_only and write: b"):
        load_tools_file(both)
    with pytest.raises(ConfigError, match="not found"):
        load_tools_file(tmp_path / "missing.yaml")


def test_bare_and_wrapped_specs_and_their_read_only_flag(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n"
        "  - {name: lookup, description: Looks up., read_only: true}\n"
        "  - type: function\n    function: {name: change, parameters: {type: object, properties: {v: {type: integer}}}}\n"
    )
    override = load_tools_file(path)
    lookup, change = override.tools
    assert (lookup.name, lookup.description, lookup.read_only) == ("lookup", "Looks up.", True)
    assert lookup.parameters == {"type": "object", "properties": {}}
    assert (change.name, change.read_only, change.parameters["properties"]) == ("change", None, {"v": {"type": "integer"}})


def test_apply_override_replaces_by_name_then_sets_flags():
    inferred = infer_tool_specs(calls("a", {"x": 1}) + calls("b", {"y": "s"}))
    explicit = ToolSpec(name="b", description="B.", parameters={"type": "object", "properties": {}})
    extra = ToolSpec(name="c", description="C.", parameters={"type": "object", "properties": {}}, read_only=True)
    override = ToolsOverride(tools=(explicit, extra), read_only=frozenset({"a"}), write=frozenset({"c"}))
    a, b, c = apply_override(inferred, override)
    assert (a.name, a.read_only, a.parameters) == ("a", True, inferred[0].parameters)
    assert (b.description, b.read_only) == ("B.", None)
    assert (c.name, c.read_only) == ("c", False)  # the user's list beats the spec's own flag
    assert apply_override(inferred, None) == inferred
