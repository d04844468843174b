"""The built-in store domain: tools, grading, tasks, the scripted expert."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from specagent.core.errors import TaskFileError
from specagent.core.interfaces import Environment
from specagent.core.types import Message, ToolCall
from specagent.envs.store import POLICY, StoreEnv, expert_steps
from specagent.envs.store.build_db import build_db
from specagent.envs.store.build_tasks import build_tasks, render_tasks
from specagent.envs.store.env import CATEGORIES, DB_PATH, TASKS_PATH, normalize_text
from specagent.envs.store.tools import TOOL_SPECS

ENV = StoreEnv()  # read-only uses share one env; tests that act call reset first
SPECS = {spec.name: spec for spec in TOOL_SPECS}
READ_TOOLS = sorted(name for name, spec in SPECS.items() if spec.read_only)
WRITE_TOOLS = sorted(name for name, spec in SPECS.items() if not spec.read_only)


def run_episode(env: StoreEnv, task_id: str, steps: list[Message]) -> tuple[list[Message], list[str]]:
    """Reset, then play ``steps``: execute each tool call and append its observation."""
    messages = env.reset(task_id)
    observations = []
    for step in steps:
        messages.append(step)
        for call in step.tool_calls:
            observation = env.execute(call)
            observations.append(observation)
            messages.append(Message(role="tool", content=observation, tool_call_id=call.id))
    return messages, observations


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(id="call_0", name=name, arguments=arguments)


def db_of(env: StoreEnv) -> dict:
    return env._db  # the tests read state directly; the protocol only sees hashes


# ---------------------------------------------------------------- the expert and grading


@pytest.mark.parametrize("task_id", ENV.task_ids())
def test_expert_scores_one_on_every_task(task_id):
    env = StoreEnv()
    messages, observations = run_episode(env, task_id, expert_steps(env, task_id))
    result = env.reward(messages)
    assert result.reward == 1.0, result.info
    assert result.info["db_match"] and result.info["missing_facts"] == []
    assert not any(o.startswith("Error:") for o in observations), observations


@pytest.mark.parametrize("task_id", ENV.task_ids())
def test_required_facts_are_grounded_in_observations_or_request(task_id):
    env = StoreEnv()
    _, observations = run_episode(env, task_id, expert_steps(env, task_id))
    seen = normalize_text(" ".join(observations + [env.task(task_id)["request"]]))
    assert [f for f in env.task(task_id)["required_facts"] if normalize_text(f) not in seen] == []


def test_expert_calls_are_numbered_and_one_per_message():
    steps = expert_steps(ENV, "multi_write_03")
    calls = [m.tool_calls for m in steps[:-1]]
    assert all(len(c) == 1 for c in calls)
    assert [c[0].id for c in calls] == [f"call_{n}" for n in range(len(calls))]
    assert steps[-1].tool_calls == () and "54.20" in steps[-1].content
    assert [c[0].name for c in calls][-2:] == ["cancel_pending_order", "exchange_delivered_order_items"]


def test_wrong_write_scores_zero():
    env = StoreEnv()
    steps = expert_steps(env, "single_write_01")  # cancels W1002
    wrong = [call("cancel_pending_order", order_id="W1005", reason="no longer needed")]
    messages, observations = run_episode(env, "single_write_01", [Message("assistant", None, tuple(wrong)), steps[-1]])
    assert not observations[0].startswith("Error:")
    result = env.reward(messages)
    assert result.reward == 0.0
    assert result.info["db_match"] is False and result.info["missing_facts"] == []
    assert result.info["final_hash"] != result.info["gold_hash"]


def test_doing_nothing_on_a_write_task_scores_zero():
    env = StoreEnv()
    messages, _ = run_episode(env, "single_write_01", [expert_steps(env, "single_write_01")[-1]])
    assert env.reward(messages).reward == 0.0


def test_missing_fact_scores_zero():
    env = StoreEnv()
    steps = expert_steps(env, "single_write_06")
    messages, _ = run_episode(env, "single_write_06", steps[:-1] + [Message("assistant", "Your return is requested.")])
    result = env.reward(messages)
    assert result.reward == 0.0
    assert result.info["db_match"] is True
    assert result.info["missing_facts"] == ["29.99", "R004"]


def test_facts_count_only_in_assistant_messages():
    env = StoreEnv()
    messages = env.reset("lookup_04") + [Message("user", "59.00"), Message("tool", "59.00", tool_call_id="x")]
    assert env.reward(messages).info["missing_facts"] == ["59.00"]
    assert env.reward(messages + [Message("assistant", "You have $59 left.")]).reward == 1.0


@pytest.mark.parametrize(
    ("said", "fact"),
    [("$54.2", "54.20"), ("54.20", "$54.20"), ("$37", "37.00"), ("1,054.20", "1054.20"),
     ("tracking   TRK1", "tracking trk1"), ("Refund: $37.", "37.00")],
)
def test_fact_normalisation(said, fact):
    assert normalize_text(fact) in normalize_text(said)


def test_fact_normalisation_keeps_different_amounts_apart():
    assert normalize_text("54.20") not in normalize_text("$5.42")
    assert normalize_text("37.00") not in normalize_text("37.50")


def test_reward_info_and_gold_hash():
    env = StoreEnv()
    env.reset("lookup_01")
    info = env.reward([]).info
    assert set(info) == {"db_match", "missing_facts", "gold_hash", "final_hash"}
    assert env.gold_hash("lookup_01") == env.initial_hash() == info["final_hash"]
    assert env.gold_hash("single_write_01") != env.initial_hash()


def test_reward_before_reset_is_an_error():
    with pytest.raises(RuntimeError, match="reset"):
        StoreEnv().reward([])


# ---------------------------------------------------------------- tools


def test_tool_counts_and_flags():
    assert len(READ_TOOLS) >= 8
    assert len([n for n in WRITE_TOOLS if n != "transfer_to_human_agents"]) >= 5
    assert SPECS["transfer_to_human_agents"].read_only is False
    assert all(isinstance(spec.read_only, bool) for spec in TOOL_SPECS)
    assert len(SPECS) == len(TOOL_SPECS)


@pytest.mark.parametrize("spec", TOOL_SPECS, ids=lambda s: s.name)
def test_tool_schemas_are_strict_and_valid(spec):
    Draft202012Validator.check_schema(spec.parameters)
    assert spec.parameters["type"] == "object"
    assert spec.parameters["additionalProperties"] is False
    assert sorted(spec.parameters["required"]) == sorted(spec.parameters["properties"])
    assert "\n" not in spec.description and len(spec.description) <= 60  # one short sentence


def test_policy_and_schemas_fit_the_small_model_budget():
    # SmolLM2-135M has 2048 tokens; the prompt renders function objects as JSON.
    functions = [spec.to_openai()["function"] for spec in TOOL_SPECS]
    compact = len(POLICY) + len(json.dumps(functions, separators=(",", ":")))
    full = len(POLICY) + len(json.dumps([spec.to_openai() for spec in TOOL_SPECS]))
    assert len(POLICY.split()) <= 200
    assert compact <= 4500, compact
    assert full <= 5300, full


def test_terminal_only_for_transfer():
    assert ENV.is_terminal(call("transfer_to_human_agents", summary="x"))
    assert not any(ENV.is_terminal(call(name)) for name in SPECS if name != "transfer_to_human_agents")
    assert not ENV.is_terminal(ToolCall(id="c", name=["not", "a", "name"], arguments={}))  # type: ignore[arg-type]


def valid_read_calls(db: dict) -> list[ToolCall]:
    """Every read-only tool, with arguments taken from the database."""
    users, orders = db["users"].values(), db["orders"]
    calls = [call("list_product_types"), call("calculate", expression="(19.99 + 5) * 2 - 1 / 4")]
    for user in users:
        calls.append(call("find_user_id_by_email", email=user["email"]))
        calls.append(call("find_user_id_by_name_zip", first_name=user["first_name"], last_name=user["last_name"],
                          zip=user["address"]["zip"]))
        calls.append(call("get_user_details", user_id=user["user_id"]))
    calls += [call("get_order_details", order_id=o) for o in orders]
    calls += [call("get_product_details", product_id=p) for p in db["products"]]
    calls += [call("get_return_status", return_id=r) for r in db["returns"]]
    return calls


def test_read_only_tools_never_change_state():
    env = StoreEnv()
    env.reset("lookup_01")
    before = env.state_hash()
    calls = valid_read_calls(db_of(env))
    assert {c.name for c in calls} == set(READ_TOOLS)
    for c in calls:
        observation = env.execute(c)
        assert not observation.startswith("Error:"), (c, observation)
    assert env.state_hash() == before and env.write_log == []


def test_read_tools_answer_with_the_data():
    env = StoreEnv()
    env.reset("lookup_01")
    assert env.execute(call("find_user_id_by_email", email="MIA.ROSSI50@example.com")) == "mia_rossi_1250"
    assert env.execute(call("find_user_id_by_name_zip", first_name="sofia", last_name="Haddad", zip="37963")) == (
        "sofia_haddad_1319"
    )
    assert json.loads(env.execute(call("get_order_details", order_id="W1007")))["status"] == "delivered"
    assert json.loads(env.execute(call("list_product_types")))["Desk Lamp"] == "p104"
    assert env.execute(call("calculate", expression="40.49+125.38")) == "165.87"


def test_reset_gives_a_fresh_database():
    env = StoreEnv()
    env.reset("single_write_01")
    initial = env.state_hash()
    assert initial == env.initial_hash()
    env.execute(call("cancel_pending_order", order_id="W1002", reason="no longer needed"))
    assert env.state_hash() != initial and len(env.write_log) == 1
    env.reset("single_write_01")
    assert env.state_hash() == initial and env.write_log == []
    assert db_of(env)["orders"]["W1002"]["status"] == "pending"


def test_reset_returns_policy_then_request():
    messages = StoreEnv().reset("lookup_02")
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[0].content == POLICY
    assert messages[1].content.startswith("Hello, this is Sofia Haddad")


def test_unknown_task_id():
    with pytest.raises(KeyError, match="nope"):
        StoreEnv().reset("nope")


def test_write_log_records_write_calls_even_refused_ones():
    env = StoreEnv()
    env.reset("policy_forbids_01")
    env.execute(call("get_order_details", order_id="W1028"))
    refused = call("cancel_pending_order", order_id="W1028", reason="no longer needed")
    assert env.execute(refused).startswith("Error:")
    env.execute(call("transfer_to_human_agents", summary="wants to cancel a delivered order"))
    assert [c.name for c in env.write_log] == ["cancel_pending_order", "transfer_to_human_agents"]
    assert env.write_log[0] == refused
    assert env.state_hash() == env.initial_hash()


def test_user_turn_gives_followups_in_order_then_none():
    env = StoreEnv()
    env.reset("single_write_01")
    assert env.user_turn("Shall I cancel it?") == "Yes, please go ahead."
    assert env.user_turn("Done.") is None
    env.reset("single_write_01")
    assert env.user_turn("Shall I?") == "Yes, please go ahead."
    env.reset("lookup_01")
    assert env.user_turn("anything") is None


def test_store_env_satisfies_the_environment_protocol():
    assert isinstance(StoreEnv(), Environment)
    assert StoreEnv.name == "store"


# ---------------------------------------------------------------- errors are observations


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("delete_everything", {}, "unknown tool"),
        ("get_order_details", {"order_id": "W9999"}, "not found"),
        ("get_user_details", {"user_id": "nobody"}, "not found"),
        ("get_product_details", {"product_id": 101}, "invalid arguments"),
        ("get_order_details", {}, "'order_id' is a required property"),
        ("get_order_details", {"order_id": "W1001", "extra": 1}, "invalid arguments"),
        ("get_order_details", "W1001", "invalid arguments"),
        ("cancel_pending_order", {"order_id": "W1002", "reason": "bored"}, "invalid arguments"),
        ("cancel_pending_order", {"order_id": "W1028", "reason": "no longer needed"}, "delivered"),
        ("return_delivered_order_items", {"order_id": "W1007", "item_ids": [], "payment_method_id": "x"}, "empty"),
        ("return_delivered_order_items",
         {"order_id": "W1007", "item_ids": ["10105"], "payment_method_id": "paypal_8356"}, "original payment"),
        ("exchange_delivered_order_items",
         {"order_id": "W1007", "item_ids": ["10105"], "new_item_ids": ["10201"], "payment_method_id": "paypal_8356"},
         "exchanges keep the product"),
        ("exchange_delivered_order_items",
         {"order_id": "W1007", "item_ids": ["10105"], "new_item_ids": ["10105"], "payment_method_id": "paypal_8356"},
         "same variant"),
        ("modify_pending_order_payment", {"order_id": "W1002", "payment_method_id": "paypal_8356"}, "does not belong"),
        ("calculate", {"expression": "__import__('os').system('true')"}, "only numbers"),
        ("calculate", {"expression": "2 ** 99999"}, "only numbers"),
        ("calculate", {"expression": "1/0"}, "division by zero"),
        ("calculate", {"expression": "(("}, "cannot parse"),
    ],
)
def test_errors_are_observations(name, arguments, expected):
    env = StoreEnv()
    env.reset("lookup_01")
    observation = env.execute(ToolCall(id="c", name=name, arguments=arguments))
    assert observation.startswith("Error:") and expected in observation, observation
    assert env.state_hash() == env.initial_hash()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)

# Real ids from the seed data (plus unknown ones), so that many generated writes succeed.
ID_POOLS = {
    "order_id": ["W1002", "W1010", "W1036", "W1007", "W1013", "W1016", "W1028", "W1009", "W9999"],
    "item_ids": ["10105", "10101", "10104", "10401", "10402", "10604", "10601", "10303", "10404", "10301"],
    "payment_method_id": ["credit_card_4997", "paypal_8356", "store_credit_4196", "credit_card_1461", "paypal_1010",
                          "credit_card_6790", "credit_card_3092", "store_credit_6324", "credit_card_6125"],
    "user_id": ["mia_rossi_1250", "nobody"],
    "return_id": ["R001", "R004"],
}
ID_POOLS["new_item_ids"] = ID_POOLS["item_ids"]


def argument_values(key: str, schema: dict) -> st.SearchStrategy:
    """Values for one argument: mostly real ids and enum members, sometimes arbitrary text.

    ``st.one_of`` picks its branches evenly, so a repeated branch is a weighted one.
    """
    pool = ID_POOLS.get(key) or schema.get("enum") or ["Main St", "Austin", "TX", "78701"]
    if schema["type"] == "array":
        real = st.lists(st.sampled_from(pool), min_size=1, max_size=2)
        return st.one_of(real, real, real, st.lists(st.text(max_size=5), max_size=2))
    return st.one_of(*[st.sampled_from(pool)] * 4, st.text(max_size=6))


@st.composite
def tool_calls(draw) -> ToolCall:
    """Calls to real and made-up tools; arguments mostly shaped like the schema, sometimes garbage."""
    name = draw(st.one_of(st.sampled_from(sorted(SPECS)), *[st.sampled_from(WRITE_TOOLS)] * 2, st.text(max_size=10)))
    if name in SPECS and draw(st.integers(0, 3)) > 0:
        properties = SPECS[name].parameters["properties"]
        arguments = {key: draw(argument_values(key, schema)) for key, schema in properties.items()}
    else:
        arguments = draw(JSON_VALUES)
    return ToolCall(id="c", name=name, arguments=arguments)


@settings(max_examples=300, deadline=None)
@given(st.lists(tool_calls(), min_size=1, max_size=5))
def test_execute_never_raises_and_refused_calls_change_nothing(calls):
    env = StoreEnv()
    env.reset("lookup_01")
    for c in calls:
        before = env.state_hash()
        observation = env.execute(c)
        assert isinstance(observation, str) and observation
        if observation.startswith("Error:") or SPECS.get(c.name) is None or SPECS[c.name].read_only:
            assert env.state_hash() == before, (c, observation)
    assert [c.name for c in env.write_log] == [c.name for c in calls if c.name in WRITE_TOOLS]


# ---------------------------------------------------------------- tool semantics


def test_cancel_refunds_store_credit_at_once():
    env = StoreEnv()
    env.reset("single_write_03")
    env.execute(call("cancel_pending_order", order_id="W1032", reason="no longer needed"))
    credit = db_of(env)["users"]["benjamin_tanaka_1500"]["payment_methods"][-1]
    assert credit["balance"] == 37.0 + 54.2
    assert db_of(env)["orders"]["W1032"]["status"] == "cancelled"


def test_only_one_return_per_order():
    env = StoreEnv()
    env.reset("single_write_08")
    first = call("return_delivered_order_items", order_id="W1016", item_ids=["10303"],
                 payment_method_id="credit_card_6125")
    second = call("return_delivered_order_items", order_id="W1016", item_ids=["10404"],
                  payment_method_id="credit_card_6125")
    assert json.loads(env.execute(first))["return_id"] == "R004"
    assert "already has return R004" in env.execute(second)


def test_exchange_charges_the_price_difference():
    env = StoreEnv()
    env.reset("single_write_10")
    result = env.execute(call("exchange_delivered_order_items", order_id="W1015", item_ids=["10702"],
                              new_item_ids=["10705"], payment_method_id="credit_card_5812"))
    assert json.loads(result)["price_difference"] == 5.0
    assert db_of(env)["orders"]["W1015"]["payment_history"][-1] == {
        "type": "payment", "amount": 5.0, "payment_method_id": "credit_card_5812"
    }


def test_transfer_changes_nothing():
    env = StoreEnv()
    env.reset("lookup_01")
    assert "Transfer successful" in env.execute(call("transfer_to_human_agents", summary="needs help"))
    assert env.state_hash() == env.initial_hash()


# ---------------------------------------------------------------- tasks


def test_task_counts_by_category():
    counts = collections.Counter(ENV.task(t)["category"] for t in ENV.task_ids())
    assert counts == {"lookup": 12, "single_write": 12, "lookups_then_write": 8, "policy_forbids": 6, "multi_write": 4}
    assert set(counts) == set(CATEGORIES)


@pytest.mark.parametrize("task_id", ENV.task_ids())
def test_gold_actions_fit_their_tool_schemas(task_id):
    task = ENV.task(task_id)
    for action in task["gold_actions"]:
        spec = SPECS[action["name"]]
        assert spec.read_only is False
        Draft202012Validator(spec.parameters).validate(action["arguments"])
    writes = {"lookup": 0, "policy_forbids": 0, "single_write": 1, "lookups_then_write": 1}
    assert len(task["gold_actions"]) == writes.get(task["category"], len(task["gold_actions"]))
    if task["category"] == "multi_write":
        assert len(task["gold_actions"]) >= 2


@pytest.mark.parametrize("task_id", [t for t in ENV.task_ids() if t.startswith("policy_forbids")])
def test_policy_forbidden_writes_are_refused_by_the_tool(task_id):
    env = StoreEnv()
    task = env.task(task_id)
    assert task["gold_actions"] == []
    env.reset(task_id)
    action = task["forbidden_action"]
    observation = env.execute(ToolCall(id="c", name=action["name"], arguments=action["arguments"]))
    assert observation.startswith("Error:"), observation
    assert env.state_hash() == env.gold_hash(task_id) == env.initial_hash()


@pytest.mark.parametrize("task_id", ENV.task_ids())
def test_requests_identify_the_user_and_confirm(task_id):
    request = ENV.task(task_id)["request"]
    assert "@example.com" in request or "zip code" in request
    if ENV.task(task_id)["category"] != "lookup":
        assert any(word in request for word in ("confirm", "I'm sure"))


def test_shipped_data_is_what_the_builders_produce():
    db = build_db()
    assert json.loads(DB_PATH.read_text()) == db
    assert TASKS_PATH.read_text() == render_tasks(build_tasks(db))


def test_seed_database_size():
    db = json.loads(DB_PATH.read_text())
    assert (len(db["users"]), len(db["orders"]), len(db["products"])) == (20, 40, 15)
    statuses = collections.Counter(o["status"] for o in db["orders"].values())
    assert set(statuses) == {"pending", "processed", "delivered", "cancelled"}


# ---------------------------------------------------------------- task files


def write_lines(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def good_task(task_id: str = "t1", **changes) -> str:
    task = {"id": task_id, "category": "single_write", "request": "Hi, I'm Liam Patel. Cancel W1002.",
            "gold_actions": [{"name": "cancel_pending_order",
                              "arguments": {"order_id": "W1002", "reason": "no longer needed"}}],
            "required_facts": ["29.99"]}
    task.update(changes)
    return json.dumps(task)


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("{not json", "invalid JSON"),
        ('["a list"]', "expected a JSON object"),
        (json.dumps({"id": "t2", "category": "lookup"}), "missing required key(s) request, gold_actions"),
        (good_task("t2", category="chitchat"), "category 'chitchat'"),
        (good_task("t2", gold_actions=[{"name": "get_order_details", "arguments": {"order_id": "W1"}}]),
         "must name a state-changing tool"),
        (good_task("t2", gold_actions=[{"name": "cancel_pending_order", "arguments": {"order_id": "W1002"}}]),
         "'reason' is a required property"),
        (good_task("t2", required_facts="29.99"), "required_facts must be a list of strings"),
        (good_task("t1"), "duplicate task id 't1' (first on line 1)"),
    ],
)
def test_broken_task_line_names_file_and_line(tmp_path, bad_line, problem):
    path = write_lines(tmp_path, [good_task("t1"), "", bad_line])
    with pytest.raises(TaskFileError) as caught:
        StoreEnv(tasks_path=path)
    assert str(caught.value).startswith(f"{path}:3: ")
    assert problem in str(caught.value)


def test_missing_task_file(tmp_path):
    with pytest.raises(TaskFileError, match="cannot read task file"):
        StoreEnv(tasks_path=tmp_path / "absent.jsonl")


def test_custom_task_file_runs_with_the_fallback_expert(tmp_path):
    env = StoreEnv(tasks_path=write_lines(tmp_path, [good_task("t1"), good_task("t2", required_facts=[])]))
    assert env.task_ids() == ["t1", "t2"]
    messages, _ = run_episode(env, "t1", expert_steps(env, "t1"))
    assert env.reward(messages).reward == 1.0
    assert messages[-1].content == "All done. Summary: 29.99."
