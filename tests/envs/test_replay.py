"""ReplayEnv: recorded observations keyed by canonical call and state (task, successful writes so far)."""

from __future__ import annotations

from collections import Counter

import pytest

from specagent.core.interfaces import Environment
from specagent.core.types import Message, ToolCall, ToolSpec, Trajectory
from specagent.data.importers import convert_files
from specagent.envs.replay import UNRECORDED_PREFIX, ReplayEnv
from tests.data.conftest import AIRLINE_YAML, FIXTURES, airline_import, airline_path  # noqa: F401 (fixtures)

OBJ = {"type": "object", "properties": {}}
TOOLS = [
    ToolSpec("get_order", "", OBJ, read_only=True),
    ToolSpec("search", "", OBJ, read_only=True),
    ToolSpec("cancel_order", "", OBJ, read_only=False),
    ToolSpec("transfer_to_human_agents", "", OBJ, read_only=False),
]


def run(traj_id: str, task_id: str, steps: list[tuple[str, dict, str]], reward: float | None = 1.0) -> Trajectory:
    """A recorded run: policy, request, then one assistant call + result per step, then a reply."""
    messages = [Message("system", "policy"), Message("user", f"request {traj_id}")]
    for i, (name, arguments, observation) in enumerate(steps):
        call = ToolCall(f"c{i}", name, arguments)
        messages += [Message("assistant", None, (call,)), Message("tool", observation, tool_call_id=call.id, name=name)]
    messages += [Message("assistant", "done"), Message("user", "thanks")]
    return Trajectory(traj_id, task_id, list(TOOLS), messages, reward=reward)


def call(name: str, **arguments) -> ToolCall:
    return ToolCall("x", name, arguments)


def test_satisfies_the_environment_protocol():
    env = ReplayEnv([run("r1", "t", [])])
    assert isinstance(env, Environment)
    assert env.task_ids() == ["r1"] and [t.name for t in env.tool_specs()] == [t.name for t in TOOLS]


def test_reset_reward_and_constants():
    first = run("r1", "t", [("get_order", {"id": "#1"}, "pending")], reward=0.0)
    env = ReplayEnv([first, run("r2", "t", [], reward=None)])
    assert env.reset("r1") == first.messages[:2]
    assert env.reward([]).reward == 0.0 and env.reward([]).info == {"source": "replay", "trajectory": "r1", "recorded": True}
    env.reset("r2")
    assert env.reward([]).info["recorded"] is False
    assert env.state_hash() == "replay" and env.user_turn("anything") is None
    with pytest.raises(KeyError, match="unknown trajectory 'nope'"):
        env.reset("nope")
    with pytest.raises(RuntimeError, match="reset"):
        ReplayEnv([first]).execute(call("get_order", id="#1"))


def test_canonical_calls_find_the_recorded_observation():
    recorded = run("r1", "t", [("search", {"query": "red shoe", "limit": 5, "max_price": 20.5}, "3 hits")])
    env = ReplayEnv([recorded])
    env.reset("r1")
    spellings = [
        call("search", limit=5, max_price=20.5, query="red shoe"),  # argument order
        call("search", query="red shoe", limit=5.0, max_price=20.5),  # 5 vs 5.0
        call("search", query="  red shoe ", limit=5, max_price=20.500),  # whitespace around a string value
        ToolCall.from_openai({"id": "y", "function": {  # whitespace and key order in the JSON text
            "name": "search", "arguments": '{ "max_price" : 20.5,\n "limit":5.0 , "query": "red shoe"}'}}),
    ]
    for spelling in spellings:
        assert env.is_recorded(spelling)
        assert env.execute(spelling) == "3 hits"
    assert (env.replayed, env.unrecorded) == (4, 0)


def test_unrecorded_calls_are_counted_and_listed():
    env = ReplayEnv([run("r1", "t", [("get_order", {"id": "#1"}, "pending")])])
    env.reset("r1")
    other = call("get_order", id="#2")
    assert not env.is_recorded(other) and env.unrecorded == 0  # asking does not count
    text = env.execute(other)
    assert text.startswith(UNRECORDED_PREFIX) and 'get_order({"id":"#2"})' in text
    env.execute(call("search", query="x"))
    assert env.unrecorded == 2
    assert env.unrecorded_calls == ['get_order({"id":"#2"})', 'search({"query":"x"})']


def test_write_epochs_give_the_state_of_the_cut_point():
    recorded = run("r1", "t", [
        ("get_order", {"id": "#1"}, "pending"),
        ("cancel_order", {"id": "#1"}, "cancelled #1"),
        ("get_order", {"id": "#1"}, "cancelled"),
        ("get_order", {"id": "#2"}, "delivered"),
    ])
    env = ReplayEnv([recorded])
    before, after = call("get_order", id="#1"), call("get_order", id="#2")
    env.reset("r1")
    assert env.execute(before) == "pending"
    assert not env.is_recorded(after)  # only seen after the cancel: its state before is unknown
    assert env.execute(call("cancel_order", id="#1")) == "cancelled #1" and env.epoch == 1  # the write happened
    assert env.execute(before) == "cancelled" and env.execute(after) == "delivered"
    env.seek(0)
    assert env.execute(before) == "pending"
    env.seek(6)  # after the cancel's result
    assert env.execute(before) == "cancelled"
    assert env.stats().conflicting_keys == 1 and env.stats().same_epoch_conflicts == 0
    with pytest.raises(ValueError, match="outside"):
        env.seek(99)


def test_refused_writes_change_nothing():
    recorded = run("r1", "t", [
        ("cancel_order", {"id": "#9"}, "Error: order #9 is delivered"),
        ("get_order", {"id": "#1"}, "pending"),
    ])
    env = ReplayEnv([recorded])
    env.reset("r1")
    assert env.execute(call("get_order", id="#1")) == "pending"  # recorded after the refused write, same epoch
    assert env.execute(call("cancel_order", id="#9")).startswith("Error") and env.epoch == 0


def test_unclassified_tools_count_as_writes():
    tools = [ToolSpec("peek", "", OBJ)]  # read_only None: unknown
    steps = [("peek", {}, "a")]
    recorded = Trajectory("r1", "t", tools, run("r1", "t", steps).messages)
    env = ReplayEnv([recorded])
    env.reset("r1")
    env.execute(call("peek"))
    assert env.epoch == 1
    env = ReplayEnv([recorded], read_only=["peek"])  # the caller's classification wins
    env.reset("r1")
    env.execute(call("peek"))
    assert env.epoch == 0


def test_other_runs_of_the_task_answer_only_at_the_same_state():
    own = run("r1", "t", [("get_order", {"id": "#1"}, "pending"), ("cancel_order", {"id": "#1"}, "ok")])
    same_start = run("r2", "t", [("search", {"q": "x"}, "hits"), ("cancel_order", {"id": "#1"}, "ok"),
                                 ("get_order", {"id": "#3"}, "late-A"), ("search", {"q": "y"}, "stable")])
    agreeing = run("r3", "t", [("cancel_order", {"id": "#1"}, "ok"), ("get_order", {"id": "#3"}, "late-B"),
                               ("search", {"q": "y"}, "stable")])
    other_task = run("r4", "u", [("search", {"q": "z"}, "elsewhere")])
    env = ReplayEnv([own, same_start, agreeing, other_task])
    env.reset("r1")
    assert env.execute(call("search", q="x")) == "hits"  # r2 made it at the start, where we are
    assert not env.is_recorded(call("get_order", id="#3"))  # r2 and r3 made it only after a cancel
    assert not env.is_recorded(call("search", q="y"))
    assert not env.is_recorded(call("search", q="z"))  # another task's run
    env.execute(call("cancel_order", id="#1"))
    assert env.state == ('cancel_order({"id":"#1"})',)
    assert not env.is_recorded(call("search", q="x"))  # recorded before the cancel only
    assert env.execute(call("search", q="y")) == "stable"  # r2 and r3 made it after the same cancel
    assert not env.is_recorded(call("get_order", id="#3"))  # ... where they disagree
    assert env.stats().state_conflicts == 1


def test_a_lookup_after_a_write_is_never_answered_from_before_it():
    """Neither "the result never varied" (the same text in several runs, at other states) nor
    "the same text before and after" (equal recordings on both sides of a write) answers."""
    writer = run("r1", "t", [("get_order", {"id": "#1"}, "pending"), ("cancel_order", {"id": "#1"}, "cancelled #1")])
    reader = run("r2", "t", [("get_order", {"id": "#1"}, "pending"), ("get_order", {"id": "#2"}, "shipped")])
    around = run("r3", "t", [("get_order", {"id": "#4"}, "shipped"), ("cancel_order", {"id": "#1"}, "cancelled #1"),
                             ("cancel_order", {"id": "#2"}, "cancelled #2"), ("get_order", {"id": "#4"}, "shipped")])
    env = ReplayEnv([writer, reader, around])
    env.reset("r1")
    assert env.execute(call("get_order", id="#1")) == "pending"
    assert env.execute(call("get_order", id="#4")) == "shipped"  # r3's, at the start
    env.execute(call("cancel_order", id="#1"))
    assert not env.is_recorded(call("get_order", id="#1"))  # "pending" three times, all before the cancel
    assert env.execute(call("get_order", id="#1")).startswith(UNRECORDED_PREFIX)
    env.reset("r3")
    env.seek(6)  # between r3's two cancels: "shipped" before and after, but never recorded here
    assert env.epoch == 1 and not env.is_recorded(call("get_order", id="#4"))
    env.seek(8)
    assert env.execute(call("get_order", id="#4")) == "shipped"  # recorded at this state
    assert env.replayed == 4 and env.unrecorded == 1  # the cancel was replayed too


def test_runs_with_identical_writes_share_their_observations():
    first = run("r1", "t", [("cancel_order", {"id": "#1"}, "cancelled #1")])
    second = run("r2", "t", [("cancel_order", {"id": "#7"}, "Error: no order #7"),  # refused: changes nothing
                             ("cancel_order", {"id": " #1 "}, "cancelled #1"),  # the same write, canonically
                             ("get_order", {"id": "#1"}, "cancelled")])
    env = ReplayEnv([first, second])
    env.reset("r1")
    assert not env.is_recorded(call("get_order", id="#1"))  # nobody looked before the cancel
    env.seek(4)  # after r1's cancel
    assert env.execute(call("get_order", id="#1")) == "cancelled"  # r2 looked after the same write
    env.reset("r1")
    assert env.execute(call("cancel_order", id="#1")) == "cancelled #1"
    assert env.execute(call("get_order", id="#1")) == "cancelled"
    env.reset("r2")  # the other way round: r1's observations answer r2 at their common states
    assert env.execute(call("cancel_order", id="#1")) == "cancelled #1"  # r1 made it at the start too


def test_runs_with_different_writes_do_not_share():
    first = run("r1", "t", [("cancel_order", {"id": "#1"}, "ok"), ("cancel_order", {"id": "#2"}, "ok")])
    other_write = run("r2", "t", [("cancel_order", {"id": "#2"}, "ok"), ("get_order", {"id": "#1"}, "pending")])
    other_order = run("r3", "t", [("cancel_order", {"id": "#2"}, "ok"), ("cancel_order", {"id": "#1"}, "ok"),
                                  ("get_order", {"id": "#3"}, "pending")])
    env = ReplayEnv([first, other_write, other_order])
    env.reset("r1")
    env.seek(4)  # after cancelling #1
    assert not env.is_recorded(call("get_order", id="#1"))  # r2 looked after cancelling #2 instead
    env.seek(6)  # after cancelling #1 then #2: the same writes as r3, in another order
    assert not env.is_recorded(call("get_order", id="#3"))
    env.reset("r1")  # following another run's writes leads to its states
    assert env.execute(call("cancel_order", id="#2")) == "ok"  # r2 and r3 made it at the start
    assert env.execute(call("get_order", id="#1")) == "pending"  # r2's, after the same write
    assert env.execute(call("cancel_order", id="#1")) == "ok"  # r3's
    assert env.execute(call("get_order", id="#3")) == "pending"


def test_runs_that_disagree_at_one_state():
    runs = [run(f"r{i}", "t", [("get_order", {"id": "#1"}, text)]) for i, text in enumerate(["a", "b"])]
    env = ReplayEnv([*runs, run("r9", "t", [])])
    env.reset("r1")
    assert env.execute(call("get_order", id="#1")) == "b"  # its own recording first
    env.reset("r9")
    assert not env.is_recorded(call("get_order", id="#1"))  # no agreement: unknown
    assert env.stats().state_conflicts == 1


def test_terminal_calls():
    env = ReplayEnv([run("r1", "t", [])])
    assert env.is_terminal(call("transfer_to_human_agents", summary="s"))
    assert not env.is_terminal(call("cancel_order"))
    env = ReplayEnv([run("r1", "t", [])], terminal={"cancel_order"})
    assert env.is_terminal(call("cancel_order")) and not env.is_terminal(call("transfer_to_human_agents"))
    assert ReplayEnv([run("r1", "t", [])], terminal=lambda name: name.endswith("_order")).is_terminal(call("get_order"))


def test_tau2_opening_messages_include_the_greeting():
    trajectories, _ = convert_files([FIXTURES / "tau2_sim.json"])
    env = ReplayEnv(trajectories)
    opening = env.reset("tau2_sim:7:1")
    assert [m.role for m in opening] == ["system", "assistant", "user"]
    lookup = call("get_reservation_details", reservation_id="XEHM4B")
    # the fixture declares no tool kinds: get_user_details may have written, and both runs looked after it
    assert not env.is_recorded(lookup)
    env = ReplayEnv(trajectories, read_only=["get_user_details", "get_reservation_details"])
    env.reset("tau2_sim:7:1")
    assert env.execute(lookup) == trajectories[0].messages[6].content  # both runs, at the initial state


def test_airline_runs_replay_every_recorded_call(airline_import):
    """Every recorded read-only call of the 100 GPT-4o runs, replayed at its cut point, returns
    exactly the recorded observation; replaying whole runs in order does too, writes included."""
    trajectories, _ = airline_import
    env = ReplayEnv(trajectories)
    read_only = {t.name for t in trajectories[0].tools if t.read_only}
    hits = Counter()
    for trajectory in trajectories:
        results = {m.tool_call_id: m.content for m in trajectory.messages if m.role == "tool"}
        env.reset(trajectory.id)
        for index, message in enumerate(trajectory.messages):
            for recorded in message.tool_calls:
                if recorded.name in read_only:
                    env.seek(index)
                    hits["read"] += 1
                    hits["read_hit"] += env.execute(recorded) == results[recorded.id]
        env.reset(trajectory.id)
        for message in trajectory.messages:
            for recorded in message.tool_calls:
                hits["all"] += 1
                hits["all_hit"] += env.execute(recorded) == results[recorded.id]
    assert (hits["read_hit"], hits["read"]) == (454, 454)
    assert (hits["all_hit"], hits["all"]) == (621, 621)
    assert env.unrecorded == 0
    stats = env.stats()
    assert (stats.recorded_calls, stats.distinct_keys) == (621, 594)
    # one run booked the same reservation twice (two reservation ids); never within one state,
    # and no two runs in the same state (same task, same writes) ever disagreed
    assert (stats.conflicting_keys, stats.same_epoch_conflicts, stats.state_conflicts) == (1, 0, 0)


def test_over_the_runs_of_a_trajectories_file(tmp_path):
    from specagent.data.importers import import_trajectories

    out = tmp_path / "trajectories.jsonl"
    import_trajectories([FIXTURES / "tau2_sim.json"], out=out, tools_yaml=AIRLINE_YAML)
    from specagent.records.trajectories import read_trajectories

    env = ReplayEnv(read_trajectories(out), terminal={"transfer_to_human_agents"})
    assert env.task_ids() == ["tau2_sim:7:0", "tau2_sim:7:1"]
    env.reset("tau2_sim:7:1")
    summary = "User raj_sanchez_7340 wants to cancel basic economy reservation XEHM4B."
    assert env.execute(call("transfer_to_human_agents", summary=summary)) == "Transfer successful"  # reads: epoch 0
    env.reset("tau2_sim:7:0")  # this run never transferred; the other run of task 7 did, from the same start
    assert env.is_recorded(call("transfer_to_human_agents", summary=summary))
    env.seek(10)  # after this run's cancel: no longer the state the other run was in
    assert not env.is_recorded(call("transfer_to_human_agents", summary=summary))
