"""Class 5 attacks: classification holes that let a drafted call run unreviewed.

- a terminal tool listed or hinted as read-only is still held, and ends the episode;
- two specs of one name with conflicting flags: the write reading wins;
- the user's lists apply wherever an environment is built, Python API included;
- a misspelt name in those lists is an error naming it, for every environment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.classify import classify_tools
from specagent.core.errors import ConfigError
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, ToolCall, ToolSpec, Trajectory, union_tools
from specagent.engines.scripted import ScriptedEngine, ScriptedVerifier
from tests.core.toy import ToyEnv

OBJ = {"type": "object", "properties": {}}


class HintedTransfer(ToyEnv):
    """The toy domain, but its terminal `transfer` tool claims to be read-only."""

    def tool_specs(self):
        return [ToolSpec(s.name, s.description, s.parameters, True if s.name == "transfer" else s.read_only)
                for s in super().tool_specs()]


def drafts(*steps):
    """A weak model that drafts `steps` in order (tool name, arguments), then keeps writing."""
    def policy(messages, tools):
        done = sum(m.role == "assistant" for m in messages)
        name, args = steps[min(done, len(steps) - 1)]
        return Message("assistant", tool_calls=(ToolCall("x", name, args),))
    return policy


@pytest.mark.parametrize("env_factory,config", [
    (HintedTransfer, ProtocolConfig(max_draft_steps=4, max_steps=8)),
    (ToyEnv, ProtocolConfig(max_draft_steps=4, max_steps=8, read_only=("transfer",))),
])
def test_a_terminal_tool_is_held_and_ends_the_episode_whatever_its_read_only_class(env_factory, config):
    env = env_factory()
    weak = ScriptedEngine(drafts(("get", {"key": "a"}), ("transfer", {}), ("set", {"key": "a", "value": 7})))
    rejected = run_episode(env, "t0", "specagent",
                           Models(ScriptedEngine(lambda m, t: Message("assistant", content="no")), weak,
                                  ScriptedVerifier(lambda c, s: 0)), config)
    assert [s.kind.value for s in rejected.steps[:2]] == ["read", "write"]  # the transfer was held, not run
    assert env.write_log == []
    approved = run_episode(env, "t0", "specagent", Models(ScriptedEngine(lambda m, t: "x"), weak,
                                                          ScriptedVerifier(lambda c, s: len(s))), config)
    assert approved.stop_reason == "terminal:transfer"
    assert [m.tool_calls[0].name for m in approved.messages if m.tool_calls][-1] == "transfer"  # nothing after it
    assert env.db["a"] == 0  # the set drafted after the transfer never ran


FLAGS = st.sampled_from([True, False, None])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), FLAGS), min_size=1, max_size=8))
def test_conflicting_specs_of_one_name_classify_as_write(specs):
    tools = [ToolSpec(name, "", OBJ, flag) for name, flag in specs]
    result = classify_tools(tools)
    for name in {n for n, _ in specs}:
        assert result[name] == all(flag is True for n, flag in specs if n == name)
    merged = {t.name: t.read_only for t in union_tools([Trajectory(str(i), "t", [t], []) for i, t in enumerate(tools)])}
    for name, flag in merged.items():
        flags = [f for n, f in specs if n == name]
        assert flag == (False if False in flags else None if None in flags else True)


class TwiceDeclared(ToyEnv):
    """Declares `set` twice: once as read-only (the lie), once as write."""

    def tool_specs(self):
        specs = super().tool_specs()
        lie = next(s for s in specs if s.name == "set")
        return [ToolSpec("set", lie.description, lie.parameters, True), *specs]


def test_a_tool_declared_twice_with_conflicting_flags_is_held():
    env = TwiceDeclared()
    weak = ScriptedEngine(drafts(("set", {"key": "a", "value": 7})))
    ep = run_episode(env, "t0", "specagent", Models(ScriptedEngine(lambda m, t: Message("assistant", content="no")),
                                                    weak, ScriptedVerifier(lambda c, s: 0)),
                     ProtocolConfig(max_steps=1))
    assert ep.steps[0].kind.value == "write" and env.write_log == []


@pytest.mark.parametrize("key", ["read_only", "write"])
def test_a_misspelt_name_in_a_user_list_is_an_error_naming_it(key):
    config = ProtocolConfig(**{key: ("delet",)})
    with pytest.raises(ConfigError, match=rf"env\.{key}: unknown tool\(s\) 'delet' \(did you mean 'delete'\?\)"):
        run_episode(ToyEnv(), "t0", "weak", Models(weak=ScriptedEngine(lambda m, t: "hi")), config)


def test_misspelt_names_fail_for_every_built_in_environment(tmp_path):
    from specagent.envs.replay import ReplayEnv
    from specagent.envs.store import StoreEnv

    store = StoreEnv()
    with pytest.raises(ConfigError, match="did you mean 'get_order_details'"):
        run_episode(store, store.task_ids()[0], "weak", Models(weak=ScriptedEngine(lambda m, t: "hi")),
                    ProtocolConfig(read_only=("get_order_detail",)))
    trajectory = Trajectory("r0", "t", store.tool_specs(), [Message("user", "hi")])
    with pytest.raises(ConfigError, match="did you mean 'cancel_pending_order'"):
        ReplayEnv([trajectory], write=["cancel_pending_ordr"])
