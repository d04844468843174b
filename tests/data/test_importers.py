"""Importers on real tau-bench runs, OpenAI chat JSONL and a tau2-bench results file;
every malformed input names file, record and field, and leaves no output behind."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from specagent.core.errors import TaskFileError
from specagent.core.toolcalls import validate_message
from specagent.core.types import Trajectory
from specagent.data.importers import TrajectoryImportError, convert_files, import_trajectories
from specagent.records.trajectories import read_trajectories
from tests.data.conftest import AIRLINE_YAML, FIXTURES

TAU2 = FIXTURES / "tau2_sim.json"
AIRLINE_TOOLS = {
    "get_user_details", "get_reservation_details", "search_direct_flight", "search_onestop_flight",
    "list_all_airports", "calculate", "think", "book_reservation", "cancel_reservation",
    "update_reservation_flights", "update_reservation_baggages", "update_reservation_passengers",
    "send_certificate", "transfer_to_human_agents",
}
AIRLINE_READ_ONLY = {
    "get_user_details", "get_reservation_details", "search_direct_flight", "search_onestop_flight",
    "list_all_airports", "calculate", "think",
}


def assert_linked(trajectory: Trajectory) -> None:
    """Every call is answered right after its message by a tool message with its id and name;
    every tool message answers a call; ids are unique within the run."""
    ids = [c.id for m in trajectory.messages for c in m.tool_calls]
    assert len(ids) == len(set(ids)), trajectory.id
    i = 0
    messages = trajectory.messages
    while i < len(messages):
        message = messages[i]
        assert message.role != "tool", f"{trajectory.id}: tool message {i} answers no call"
        calls = {c.id: c.name for c in message.tool_calls}
        answers = messages[i + 1 : i + 1 + len(calls)]
        assert {(m.role, m.tool_call_id, m.name) for m in answers} == {("tool", k, v) for k, v in calls.items()}
        assert all(isinstance(c.arguments, dict) for c in message.tool_calls)
        i += 1 + len(calls)


# ---------------------------------------------------------------- tau-bench: the real airline runs


def test_tau_airline_runs_import_whole(airline_path, airline_raw):
    trajectories, report = convert_files([airline_path], model="gpt-4o")
    assert report.files == [(str(airline_path), "tau", 100)]
    assert report.trajectories == len(trajectories) == 100
    assert report.tool_calls == 621 and report.messages == 2962
    by_id = {t.id: t for t in trajectories}
    for raw in airline_raw:
        t = by_id[f"gpt-4o-trajectories-tasks-00-24:{raw['task_id']}:{raw['trial']}"]
        assert t.task_id == str(raw["task_id"]) and t.model == "gpt-4o"
        assert t.reward == raw["reward"]
        assert t.meta["task"] == raw["info"]["task"] and t.meta["reward_info"] == raw["info"]["reward_info"]
        assert len(t.messages) == len(raw["traj"])
        assert [m.role for m in t.messages] == [m["role"] for m in raw["traj"]]
        assert [m.content for m in t.messages] == [m["content"] for m in raw["traj"]]
        assert_linked(t)
    assert round(sum(t.reward for t in trajectories) / 100, 2) == 0.31


def test_tau_airline_reused_call_ids_are_renamed(airline_path, airline_raw):
    trajectories, report = convert_files([airline_path])
    renamed = sum(t.meta.get("renamed_tool_call_ids", 0) for t in trajectories)
    assert renamed == 40 and any("40 tool-call id(s) reused" in w for w in report.warnings)
    raw_calls = [c for r in airline_raw for m in r["traj"] for c in m.get("tool_calls") or []]
    calls = [c for t in trajectories for m in t.messages for c in m.tool_calls]
    assert [c.name for c in calls] == [c["function"]["name"] for c in raw_calls]
    assert [c.arguments for c in calls] == [json.loads(c["function"]["arguments"]) for c in raw_calls]
    assert sum(c.id != r["id"] for c, r in zip(calls, raw_calls)) == 40
    assert all(c.id == r["id"] or c.id.startswith(r["id"] + "_") for c, r in zip(calls, raw_calls))


def test_tau_airline_infers_14_tool_schemas(airline_path):
    trajectories, report = convert_files([airline_path])
    tools = {t.name: t for t in report.tools}
    assert set(tools) == AIRLINE_TOOLS and set(report.inferred) == AIRLINE_TOOLS
    assert all(t.read_only is None for t in tools.values())
    assert all([s.name for s in t.tools] == [s.name for s in report.tools] for t in trajectories)
    book = tools["book_reservation"].parameters
    assert book["type"] == "object" and len(book["required"]) == 11
    props = book["properties"]
    assert props["total_baggages"] == {"type": "integer"} and props["insurance"] == {"type": "string"}
    assert props["flights"] == {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"flight_number": {"type": "string"}, "date": {"type": "string"}},
            "required": ["flight_number", "date"],
        },
    }
    assert props["payment_methods"]["items"]["properties"]["amount"] == {"type": "integer"}
    flights = tools["update_reservation_flights"].parameters["properties"]["flights"]["items"]
    assert set(flights["properties"]) == {"flight_number", "date", "origin", "destination"}
    assert flights["required"] == ["flight_number", "date"]  # origin/destination only sometimes given
    assert tools["list_all_airports"].parameters == {"type": "object", "properties": {}}
    assert tools["search_direct_flight"].parameters["required"] == ["origin", "destination", "date"]
    assert tools["send_certificate"].parameters["properties"]["amount"] == {"type": "integer"}
    for t in trajectories:  # the inferred schemas accept every recorded call
        assert all(validate_message(m, t.tools) is None for m in t.messages if m.tool_calls)


def test_tau_airline_tools_yaml_applies(airline_import):
    trajectories, report = airline_import
    flags = {t.name: t.read_only for t in report.tools}
    assert flags == {name: name in AIRLINE_READ_ONLY for name in AIRLINE_TOOLS}
    assert report.inferred == []  # the file gives every schema explicitly
    assert report.tools[0].description and "inferred" not in report.tools[0].description
    send = next(t for t in report.tools if t.name == "send_certificate")
    assert send.parameters["properties"]["amount"] == {"type": "number"}
    for t in trajectories:
        assert all(validate_message(m, t.tools) is None for m in t.messages if m.tool_calls)


def test_tau_import_writes_what_it_converted(airline_path, tmp_path):
    out = tmp_path / "deep" / "trajectories.jsonl"
    report = import_trajectories([airline_path], "tau", out, AIRLINE_YAML, source="airline", model="gpt-4o")
    assert report.out == str(out) and "imported 100 trajectories" in report.summary()
    assert sum(report.rewards.values()) == 100 and list(report.rewards)[0] == "1"  # highest first
    by_hand = {}
    for t in read_trajectories(out):
        key = "unknown" if t.reward is None else f"{t.reward:g}"
        by_hand[key] = by_hand.get(key, 0) + 1
    assert report.rewards == by_hand
    assert "rewards: 1: " in report.summary()
    back = read_trajectories(out)
    again, _ = convert_files([airline_path], "tau", AIRLINE_YAML, source="airline", model="gpt-4o")
    assert back == again
    assert back[0].id == "airline:0:0" and back[0].source == "airline"
    assert [p.name for p in tmp_path.joinpath("deep").iterdir()] == ["trajectories.jsonl"]  # no temp left


def test_crashed_tau_runs_are_skipped(tmp_path, airline_raw):
    runs = [airline_raw[0], {"task_id": 9, "trial": 0, "reward": 0.0, "traj": [], "info": {"error": "RateLimitError"}}]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    trajectories, report = convert_files([path])
    assert len(trajectories) == 1
    assert report.skipped == [f"{path}: record [1] (task_id 9, trial 0): the run crashed (RateLimitError)"]


# ---------------------------------------------------------------- OpenAI chat JSONL

CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_order", "description": "An order by id.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "cancel_order", "description": "Cancels an order.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}}}}},
]


def chat_records() -> list[dict]:
    first = {
        "id": "chat-1",
        "task_id": "t1",
        "reward": 1,
        "model": "gpt-4o-mini",
        "tools": CHAT_TOOLS,
        "trial": 2,
        "messages": [
            {"role": "system", "content": "You are a store agent."},
            {"role": "user", "content": [{"type": "text", "text": "Cancel "}, {"type": "text", "text": "#W1 please"}]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": "{ \"order_id\" : \"#W1\" }"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"status\": \"pending\"}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "cancel_order", "arguments": {"order_id": "#W1"}}}]},
            {"role": "tool", "tool_call_id": "c2", "name": "cancel_order", "content": {"status": "cancelled"}},
            {"role": "assistant", "content": "Order #W1 is cancelled."},
        ],
    }
    second = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]}
    return [first, second]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_openai_jsonl_import(tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", chat_records())
    trajectories, report = convert_files([path])
    assert report.files == [(str(path), "openai", 2)]
    first, second = trajectories
    assert (first.id, first.task_id, first.reward, first.model) == ("chat-1", "t1", 1.0, "gpt-4o-mini")
    assert first.meta == {"trial": 2}
    assert [t.name for t in first.tools] == ["get_order", "cancel_order"] and first.tools[0].description == "An order by id."
    assert first.messages[1].content == "Cancel #W1 please"
    assert first.messages[2].content is None and first.messages[2].tool_calls[0].arguments == {"order_id": "#W1"}
    assert first.messages[3].name == "get_order"  # filled from the call
    assert first.messages[5].content == '{"status": "cancelled"}'
    assert_linked(first)
    # no id, no task: the line gives both; no tools: inferred from all calls of the import
    assert (second.id, second.task_id, second.model) == ("chats:2", "chats:2", "")
    assert [t.name for t in second.tools] == ["get_order", "cancel_order"]
    assert second.tools[0].read_only is None and "inferred" in second.tools[0].description
    assert report.inferred == ["get_order", "cancel_order"]


def test_openai_round_trip(tmp_path):
    """chat JSONL -> trajectories -> their OpenAI messages as chat JSONL -> the same trajectories;
    and a specagent.trajectory/v1 file is itself valid `openai` input."""
    src = write_jsonl(tmp_path / "chats.jsonl", chat_records())
    trajectories, _ = convert_files([src])
    exported = [
        {"id": t.id, "task_id": t.task_id, "reward": t.reward, "model": t.model, "meta": t.meta,
         "tools": [x.to_openai() for x in t.tools], "messages": [m.to_openai() for m in t.messages]}
        for t in trajectories
    ]
    again, _ = convert_files([write_jsonl(tmp_path / "exported.jsonl", exported)], source="chats")
    assert again == trajectories
    out = tmp_path / "trajectories.jsonl"
    import_trajectories([src], out=out)
    reread, _ = convert_files([out], "openai")
    assert reread == read_trajectories(out) == trajectories


# ---------------------------------------------------------------- tau2-bench results


def test_tau2_fixture_import():
    trajectories, report = convert_files([TAU2])
    assert report.files == [(str(TAU2), "tau2", 2)]
    first, second = trajectories
    assert (first.id, first.task_id, first.reward) == ("tau2_sim:7:0", "7", 1.0)
    assert (second.id, second.reward) == ("tau2_sim:7:1", 0.0)
    assert first.model == "gpt-4.1-mini-2025-04-14"
    assert first.messages[0].role == "system" and first.messages[0].content.startswith("# Airline Agent Policy")
    assert [m.role for m in first.messages[1:4]] == ["assistant", "user", "assistant"]
    assert len(first.messages) == 13 and len(second.messages) == 8  # 12 and 7 recorded + the policy
    assert first.messages[5].content == "Let me look up reservation XEHM4B."  # text and a call together
    assert first.messages[5].tool_calls[0].arguments == {"reservation_id": "XEHM4B"}
    assert [c.name for c in second.messages[3].tool_calls] == ["get_user_details", "get_reservation_details"]
    assert second.messages[3].content is None  # "" next to tool calls
    assert [m.name for m in second.messages[4:6]] == ["get_user_details", "get_reservation_details"]
    for t in trajectories:
        assert_linked(t)
    assert first.meta["simulation_id"] == "2b3f5e0e-8c1d-4a37-9e51-3c8f4a7d1b20"
    assert first.meta["termination_reason"] == "user_stop" and first.meta["trial"] == 0
    assert first.meta["reward_info"]["db_check"] == {"db_match": True, "db_reward": 1.0}
    assert first.meta["task"]["evaluation_criteria"]["actions"][0]["name"] == "cancel_reservation"
    assert report.inferred == ["get_user_details", "get_reservation_details", "cancel_reservation",
                               "transfer_to_human_agents"]
    assert convert_files([TAU2], "tau2", model="m")[0][0].model == "m"


def tau2_doc() -> dict:
    return json.loads(TAU2.read_text())


def test_tau2_user_side_tool_calls_are_dropped(tmp_path):
    doc = tau2_doc()
    messages = doc["simulations"][1]["messages"]
    messages[2:2] = [
        {"role": "user", "content": None, "tool_calls": [
            {"id": "u1", "name": "toggle_airplane_mode", "arguments": {}, "requestor": "user"}]},
        {"role": "tool", "id": "u1", "content": "Airplane mode: off", "requestor": "user", "error": False},
        {"role": "user", "content": "Done, it's off.", "tool_calls": [
            {"id": "u2", "name": "check_status_bar", "arguments": {}, "requestor": "user"}]},
        {"role": "tool", "id": "u2", "content": "4G", "requestor": "user", "error": False},
    ]
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    second = convert_files([path])[0][1]
    assert second.meta["dropped_user_tool_calls"] == 2
    assert [m.content for m in second.messages[2:4]] == [messages[1]["content"], "Done, it's off."]
    assert not any(c.name in ("toggle_airplane_mode", "check_status_bar") for m in second.messages for c in m.tool_calls)


def test_tau2_tool_defs_become_the_schemas(tmp_path):
    doc = tau2_doc()
    doc["info"]["environment_info"]["tool_defs"] = {
        "get_user_details": {"name": "get_user_details", "doc": "Get the details of a user.",
                             "params": {"type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]},
                             "returns": None},
    }
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    trajectories, report = convert_files([path])
    assert [(t.name, t.description) for t in trajectories[0].tools] == [("get_user_details", "Get the details of a user.")]
    assert report.inferred == []
    undeclared = "does not declare: cancel_reservation (1), get_reservation_details (2), transfer_to_human_agents (1)"
    assert any(undeclared in w for w in report.warnings), report.warnings


# ---------------------------------------------------------------- malformed input


def tau_record(traj: list) -> dict:
    return {"task_id": 4, "trial": 1, "reward": 0.0, "info": {}, "traj": traj}


GOOD_TRAJ = [
    {"role": "system", "content": "policy"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "get_user_details", "arguments": "{\"user_id\": \"u\"}"}}]},
    {"role": "tool", "tool_call_id": "a", "name": "get_user_details", "content": "{}"},
    {"role": "assistant", "content": "done"},
]


def broken_traj(edit) -> list:
    traj = copy.deepcopy(GOOD_TRAJ)
    edit(traj)
    return traj


MALFORMED = {
    "bad_json_line": (
        "chats.jsonl",
        lambda: [chat_records()[1], '{"messages": [', chat_records()[1]],
        [":2: not valid JSON"],
    ),
    "missing_messages": (
        "chats.jsonl",
        lambda: [chat_records()[1], {"id": "x", "task_id": "t"}],
        [":2 (task_id t): messages: missing: an OpenAI chat record needs a `messages` list"],
    ),
    "unparseable_arguments": (
        "runs.json",
        lambda: [tau_record(GOOD_TRAJ), tau_record(broken_traj(
            lambda t: t[2]["tool_calls"][0]["function"].update(arguments="{\"user_id\": u}")))],
        [": record [1] (task_id 4, trial 1): traj[2].tool_calls[0].function.arguments: not valid JSON"],
    ),
    "tool_message_matches_no_call": (
        "runs.json",
        lambda: [tau_record(broken_traj(lambda t: t[3].update(tool_call_id="b")))],
        [": record [0] (task_id 4, trial 1): traj[3].tool_call_id: 'b' matches no unanswered tool call"],
    ),
    "unanswered_call": (
        "runs.json",
        lambda: [tau_record(broken_traj(lambda t: t.pop(3)))],
        [": record [0] (task_id 4, trial 1): traj[2].tool_calls[0]: no tool message answers call 'a'"],
    ),
    "arguments_not_an_object": (
        "chats.jsonl",
        lambda: [{"messages": broken_traj(lambda t: t[2]["tool_calls"][0]["function"].update(arguments="[1, 2]"))}],
        [":1: messages[2].tool_calls[0].function.arguments: expected a JSON object of arguments, got a list"],
    ),
    "bad_role": (
        "chats.jsonl",
        lambda: [{"messages": broken_traj(lambda t: t[1].update(role="human"))}],
        [":1: messages[1].role: expected one of system, user, assistant, tool, got 'human'"],
    ),
    "two_problems_reported_together": (
        "chats.jsonl",
        lambda: ["not json", chat_records()[1], {"messages": []}],
        ["2 problem(s) in the input, nothing was written", ":1: not valid JSON",
         ":3: messages: empty"],
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_names_file_record_field_and_writes_nothing(tmp_path, case):
    name, records, expected = MALFORMED[case]
    path = tmp_path / name
    if name.endswith(".jsonl"):
        write_jsonl(path, records())
    else:
        path.write_text(json.dumps(records()))
    out = tmp_path / "out" / "trajectories.jsonl"
    with pytest.raises(TrajectoryImportError) as err:
        import_trajectories([path], out=out)
    assert isinstance(err.value, TaskFileError)
    text = str(err.value)
    for fragment in expected:
        if fragment.startswith((":", ": ")):
            assert f"{path}{fragment}" in text, text
        else:
            assert fragment in text, text
    assert not out.exists() and not (tmp_path / "out").exists()


def test_tau2_tool_message_id_mismatch_names_simulation_and_field(tmp_path):
    doc = tau2_doc()
    doc["simulations"][1]["messages"][4]["id"] = "call_nope"
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TrajectoryImportError) as err:
        import_trajectories([path], out=tmp_path / "t.jsonl")
    assert f"{path}: simulations[1] (task_id 7, trial 1): messages[4].id: 'call_nope' matches no" in str(err.value)
    assert not (tmp_path / "t.jsonl").exists()


def test_a_failed_import_leaves_an_existing_output_untouched(tmp_path):
    out = tmp_path / "trajectories.jsonl"
    out.write_text("previous\n")
    bad = write_jsonl(tmp_path / "chats.jsonl", [{"id": 1}])
    with pytest.raises(TrajectoryImportError):
        import_trajectories([bad], out=out)
    assert out.read_text() == "previous\n"


def test_duplicate_ids_across_inputs(tmp_path):
    with pytest.raises(TrajectoryImportError) as err:
        convert_files([TAU2, TAU2], source="same")
    assert "duplicate trajectory id 'same:7:0'" in str(err.value)


def test_unknown_format_and_self_overwrite(tmp_path):
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps([{"conversation": []}]))
    with pytest.raises(TrajectoryImportError, match=r"odd.json: cannot tell the format"):
        convert_files([odd])
    with pytest.raises(TrajectoryImportError, match="also an input"):
        import_trajectories([TAU2], out=TAU2)
    broken = tmp_path / "broken.json"
    broken.write_text('[\n  {"traj": [}\n]')
    with pytest.raises(TrajectoryImportError, match=r"broken.json: not valid JSON at line 2, column 13"):
        convert_files([broken])
    with pytest.raises(TrajectoryImportError, match=r"sim.json: simulations: expected a tau2-bench results"):
        convert_files([write_jsonl(tmp_path / "sim.json", chat_records())], "tau2")


def test_tau2_calls_without_ids_pair_by_position(tmp_path):
    doc = tau2_doc()
    sim = doc["simulations"][1]
    for call in sim["messages"][2]["tool_calls"]:
        call["id"] = ""
    for message in sim["messages"][3:5]:
        message["id"] = ""
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    second = convert_files([path])[0][1]
    assert [c.id for c in second.messages[3].tool_calls] == ["call_2_0", "call_2_1"]
    assert [(m.tool_call_id, m.name) for m in second.messages[4:6]] == [
        ("call_2_0", "get_user_details"), ("call_2_1", "get_reservation_details")]


def test_openai_json_list_is_read_too(tmp_path):
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(chat_records(), indent=2))
    trajectories, report = convert_files([path])
    assert report.files == [(str(path), "openai", 2)]
    assert [t.id for t in trajectories] == ["chat-1", "chats:1"]


def test_a_misspelt_tool_in_the_tools_yaml_warns_with_a_guess(airline_path, tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("read_only: [get_user_details, get_reservaton_details]\nwrite: [cancel_reservation]\n")
    _, report = convert_files([airline_path], "tau", tools, model="gpt-4o")
    [warning] = [w for w in report.warnings if "names no tool" in w]
    assert "get_reservaton_details (did you mean 'get_reservation_details'?)" in warning
    assert "warning: " + warning in report.summary()
