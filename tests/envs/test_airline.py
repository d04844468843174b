"""The live tau-bench airline environment, checked against the real GPT-4o runs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from specagent.config import AirlineEnvSettings, EnvConfig, MineConfig, load_config
from specagent.core.classify import classify_tools
from specagent.core.errors import ConfigError
from specagent.core.interfaces import Environment
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, StepKind, ToolCall, Trajectory
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.airline import AirlineEnv, ticket_request
from specagent.envs.airline.conformance import check, render
from specagent.envs.airline.data import data_hash
from specagent.envs.airline.tools import TOOL_SPECS
from specagent.runtime.assembly import build_env
from specagent.runtime.drafting import DraftSettings, DraftStats, draft_trajectory, live_jobs, restore

ROOT = Path(__file__).resolve().parents[2]
RUNS = Path(os.environ.get(
    "SPECAGENT_AIRLINE_RUNS",
    ROOT.parent / "shared" / "data" / "tau-bench-airline" / "gpt-4o-trajectories-tasks-00-24.json",
))
if RUNS.is_dir():  # the data dir itself: its runs file is the GPT-4o one
    RUNS = RUNS / "gpt-4o-trajectories-tasks-00-24.json"
DATA = RUNS.parent
READ_TOOLS = {"get_user_details", "get_reservation_details", "search_direct_flight", "search_onestop_flight",
              "list_all_airports", "calculate", "think"}
needs_data = pytest.mark.skipif(not RUNS.exists(), reason=f"tau-bench airline data not found at {DATA}")


@pytest.fixture(scope="module")
def env() -> AirlineEnv:
    if not RUNS.exists():
        pytest.skip(f"tau-bench airline data not found at {DATA} (set SPECAGENT_AIRLINE_RUNS)")
    return AirlineEnv(DATA, RUNS)


@pytest.fixture(scope="module")
def report(env):
    return check(env, env.data.runs)


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(id="call_0", name=name, arguments=arguments)


def gold_agent(env: AirlineEnv, reply: str = "All done."):
    """A scripted agent that makes the task's gold calls in order, then says ``reply``."""
    def policy(messages, tools):
        task_id = next(t for t in env.task_ids() if ticket_request(env.task_record(t)) == messages[1].content)
        actions = env.task_record(task_id)["actions"]
        done = sum(m.role == "assistant" for m in messages)
        if done < len(actions):
            action = actions[done]
            return Message(role="assistant", tool_calls=(ToolCall("c", action["name"], action["kwargs"]),))
        return Message(role="assistant", content=reply)

    return policy


# ---------------------------------------------------------------- conformance with the recorded runs


def test_every_recorded_call_returns_its_recorded_observation(report):
    calls = report.kinds["tool calls"]
    assert calls.failures == []
    assert (calls.checked, calls.skipped) == (621, 0)
    assert report.runs == 100 and report.kinds["records"].checked == 100 and report.kinds["records"].failures == []


def test_gold_actions_give_the_recorded_gold_hash(report):
    assert report.kinds["gold hash"].failures == [] and report.kinds["gold hash"].checked == 88
    by_hash = [t for t, how in report.confirmed.items() if how == "a recorded gt_data_hash"]
    assert sorted(by_hash, key=int) == [str(t) for t in range(25) if t not in (2, 8, 9)]  # 2, 8, 9 record outputs
    assert report.confirmed["2"].startswith("run [")  # a run that said its output and matched the gold database
    assert report.unchecked == ["8", "9"] and report.failed_tasks == set()


def test_every_graded_run_regrades_to_its_recorded_reward(report):
    for kind in ("reward", "final database", "outputs"):
        assert report.kinds[kind].failures == [], kind
    assert (report.kinds["reward"].checked, report.kinds["reward"].skipped) == (97, 3)  # 3 hit the step limit
    assert (report.kinds["outputs"].checked, report.kinds["outputs"].skipped) == (9, 3)
    assert (report.kinds["final database"].checked, report.kinds["final database"].skipped) == (89, 11)


@needs_data
def test_gold_actions_of_all_25_tasks_run_without_errors(env):
    assert env.task_ids() == [str(t) for t in range(25)]
    initial = data_hash(env.data.fresh_db())
    for task_id in env.task_ids():
        env.reset(task_id)
        actions = env.task_record(task_id)["actions"]
        observations = [env.execute(call(a["name"], **a["kwargs"])) for a in actions]
        assert not [o for o in observations if o.startswith("Error")], task_id
        assert env.state_hash() == env.gold_hash(task_id)
        writes = [a for a in actions if a["name"] not in READ_TOOLS | {"transfer_to_human_agents"}]
        assert (env.gold_hash(task_id) != initial) == bool(writes), task_id


def test_conformance_report_prints_the_figures(report):
    out = render(report)
    assert ("summary (checked/skipped/failed): records 100/0/0; tool calls 621/0/0; gold hash 88/0/0; "
            "final database 89/11/0; outputs 9/3/0; reward 97/3/0; tasks 23/2/0 (skipped: unchecked)") in out
    assert "tool calls: 621/621 passed" in out and "failures" not in out
    assert "  - run [27] (task 2, trial 1): outputs, final database, reward skipped: tau-bench never graded it" in out
    # tasks 8 and 9: no run says its output and matches the database, and their runs record no gold hash
    assert not report.ok and out.endswith("result: FAIL: 2 task(s) unchecked: 8, 9 (no run records their gold "
                                          "hash or a final database that matched it); --allow-unchecked accepts them")
    allowed = dataclasses.replace(report, allow_unchecked=True)
    assert allowed.ok and render(allowed).endswith("result: PASS, with 2 task(s) unchecked (allowed): 8, 9")


# ---------------------------------------------------------------- tools


def test_booking_changes_the_database_as_tau_bench_does(env):
    env.reset("0")
    before = env.state_hash()
    booking = dict(env.task_record("0")["actions"][0]["kwargs"])
    result = json.loads(env.execute(call("book_reservation", **booking)))
    assert result["reservation_id"] == "HATHAT" and result["created_at"] == "2024-05-15T15:00:00"
    assert result["flights"][0] == {"flight_number": "HAT136", "date": "2024-05-20", "price": 152,
                                    "origin": "JFK", "destination": "ATL"}
    user = json.loads(env.execute(call("get_user_details", user_id="mia_li_3668")))
    assert user["reservations"][-1] == "HATHAT"
    assert "certificate_7504069" not in user["payment_methods"]  # a used certificate is gone
    assert env.state_hash() == env.gold_hash("0") != before
    again = json.loads(env.execute(call("book_reservation", **{**booking, "payment_methods": [
        {"payment_id": "credit_card_4421486", "amount": 255}]})))
    assert again["reservation_id"] == "HATHAU"


def test_cancel_and_gift_card_payments(env):
    env.reset("3")
    cancelled = json.loads(env.execute(call("cancel_reservation", reservation_id="4WQ150")))
    assert cancelled["status"] == "cancelled"
    assert cancelled["payment_history"] == [{"payment_id": "gift_card_3576581", "amount": 4986},
                                            {"payment_id": "gift_card_3576581", "amount": -4986}]
    reservation = json.loads(env.execute(call("get_reservation_details", reservation_id="4WQ150")))
    assert reservation == cancelled
    user = json.loads(env.execute(call("get_user_details", user_id="chen_jackson_3290")))
    balance = user["payment_methods"]["gift_card_3576581"]["amount"]
    bags = json.loads(env.execute(call("update_reservation_baggages", reservation_id="4WQ150", total_baggages=7,
                                       nonfree_baggages=2, payment_id="gift_card_3576581")))
    assert bags["payment_history"][-1] == {"payment_id": "gift_card_3576581", "amount": 100}
    user = json.loads(env.execute(call("get_user_details", user_id="chen_jackson_3290")))
    assert user["payment_methods"]["gift_card_3576581"]["amount"] == balance - 100


@pytest.mark.parametrize(("name", "arguments", "expected"), [
    ("get_user_details", {"user_id": "nobody_1"}, "Error: user not found"),
    ("get_reservation_details", {"reservation_id": "ZZZZZZ"}, "Error: user not found"),  # sic, tau-bench's text
    ("cancel_reservation", {"reservation_id": "ZZZZZZ"}, "Error: reservation not found"),
    ("update_reservation_passengers", {"reservation_id": "4WQ150", "passengers": []},
     "Error: number of passengers does not match"),
    ("update_reservation_baggages", {"reservation_id": "4WQ150", "total_baggages": 9, "nonfree_baggages": 4,
                                     "payment_id": "credit_card_0000000"}, "Error: payment method not found"),
    ("update_reservation_flights", {"reservation_id": "4WQ150", "cabin": "business", "payment_id": "gift_card_3576581",
                                    "flights": [{"flight_number": "HAT999", "date": "2024-05-22"}]},
     "Error: flight HAT999 not found"),
    ("update_reservation_flights", {"reservation_id": "4WQ150", "cabin": "business", "payment_id": "gift_card_3576581",
                                    "flights": [{"flight_number": "HAT001", "date": "2024-05-03"}]},
     "Error: flight HAT001 not available on date 2024-05-03"),
    ("calculate", {"expression": "2 ** x"}, "Error: invalid characters in expression"),
    ("calculate", {"expression": "1 / 0"}, "Error: division by zero"),
    ("calculate", {"expression": "(1 +"}, "Error: '(' was never closed (<string>, line 1)"),
    ("calculate", {"expression": " (158 + 141) * 2 / 3"}, "199.33"),
    ("think", {"thought": "hmm"}, ""),
    ("transfer_to_human_agents", {"summary": "wants a refund"}, "Transfer successful"),
    ("book_flight", {}, "Unknown action book_flight"),
    ("cancel_reservation", {}, "Error: CancelReservation.invoke() missing 1 required positional argument: "
     "'reservation_id'"),  # tau-bench's Env.step: Python's TypeError for its invoke()
    ("cancel_reservation", {"reservation_id": "4WQ150", "reason": "x"},
     "Error: CancelReservation.invoke() got an unexpected keyword argument 'reason'"),
    ("cancel_reservation", {"reservation_id": ["4WQ150"]}, "Error: unhashable type: 'list'"),
])
def test_refusals_say_what_tau_bench_says_and_change_nothing(env, name, arguments, expected):
    env.reset("3")
    before = env.state_hash()
    assert env.execute(call(name, **arguments)) == expected
    assert env.state_hash() == before


@needs_data
def test_payment_that_does_not_add_up_is_refused(env):
    env.reset("0")
    booking = {**env.task_record("0")["actions"][0]["kwargs"],
               "payment_methods": [{"payment_id": "credit_card_4421486", "amount": 299}]}
    assert env.execute(call("book_reservation", **booking)) == (
        "Error: payment amount does not add up, total price is 255, but paid 299")


def test_tools_are_declared_read_or_write_and_only_transfer_ends(env):
    read_only = classify_tools(env.tool_specs())
    assert {name for name, ro in read_only.items() if ro} == READ_TOOLS
    assert len(read_only) == 14
    assert [s.name for s in env.tool_specs() if env.is_terminal(call(s.name))] == ["transfer_to_human_agents"]
    assert classify_tools(env.tool_specs(), read_only=["send_certificate"])["send_certificate"]  # the user wins


@needs_data
def test_tool_specs_are_those_the_import_gives_the_runs():
    """A live prompt renders the tools exactly as one built from imported trajectories."""
    from specagent.data.importers import convert_files

    trajectories, _ = convert_files([RUNS], tools_yaml=ROOT / "configs" / "import" / "tau_airline_tools.yaml")
    as_json = [json.dumps({**t.to_openai(), "read_only": t.read_only}) for t in TOOL_SPECS]
    assert as_json == [json.dumps({**t.to_openai(), "read_only": t.read_only}) for t in trajectories[0].tools]
    assert {t.task_id for t in trajectories} == {str(n) for n in range(25)}


@needs_data
def test_hash_is_tau_bench_formula_and_notices_an_int_becoming_a_float(env):
    db = env.data.fresh_db()
    db["users"]["mia_li_3668"]["payment_methods"]["certificate_7504069"]["amount"] = 250.0  # equal, not identical

    def tau_bench_hash(value):
        def hashable(v):
            if isinstance(v, dict):
                return tuple((k, hashable(x)) for k, x in sorted(v.items()))
            return tuple(hashable(x) for x in v) if isinstance(v, list) else v
        return hashlib.sha256(str(hashable(value)).encode()).hexdigest()

    assert env.data.hash(db) == data_hash(db) == tau_bench_hash(db) != env.data.hash(env.data.fresh_db())


# ---------------------------------------------------------------- episodes


def test_environment_protocol_and_policy_from_the_runs(env):
    assert isinstance(env, Environment)
    opening = env.reset("11")
    assert opening[0].role == "system" and opening[0].content.startswith("# Airline Agent Policy")
    assert opening[0].content == env.data.runs[0]["traj"][0]["content"]
    assert opening[1].role == "user" and env.task_record("11")["instruction"] in opening[1].content
    assert "explicit confirmation (yes)" in opening[1].content
    assert env.user_turn("Could you confirm?") is None  # ticket mode: the user never answers


def test_ticket_episode_with_the_gold_agent_earns_one(env):
    episode = run_episode(env, "1", "strong", Models(strong=ScriptedEngine(gold_agent(env))), ProtocolConfig())
    assert episode.reward == 1.0 and episode.stop_reason == "user_done"
    assert [m.tool_calls[0].name for m in episode.messages if m.tool_calls] == ["cancel_reservation"]


def test_required_outputs_must_be_said(env):
    said = run_episode(env, "2", "strong", Models(strong=ScriptedEngine(gold_agent(env, "You saved $23,553."))))
    assert said.reward == 1.0 and said.reward_info["outputs"] == {"23553": True}
    silent = run_episode(env, "2", "strong", Models(strong=ScriptedEngine(gold_agent(env, "Done."))))
    assert silent.reward == 0.0 and silent.reward_info["db_match"] and silent.reward_info["outputs"] == {"23553": False}
    idle = run_episode(env, "1", "strong", Models(strong=ScriptedEngine(lambda m, t: "Sorry, I cannot help.")))
    assert idle.reward == 0.0 and not idle.reward_info["db_match"]


@needs_data
def test_simulated_user_plays_the_instruction_and_stops():
    lines = iter(["Hi, I want to cancel my trip.", "###STOP###"])
    seen = []

    def user(messages, tools):
        seen.append(list(messages))
        return next(lines)

    env = AirlineEnv(DATA, RUNS, user="simulated", user_engine=ScriptedEngine(user))
    opening = env.reset("12")
    assert opening[1].content == "Hi, I want to cancel my trip."
    assert env.task_record("12")["instruction"] in seen[0][0].content
    assert [m.role for m in seen[0]] == ["system", "user"]  # the agent speaks as "user" to the user model
    assert env.user_turn("Which reservation?") is None
    assert [(m.role, m.content) for m in seen[1][2:]] == [("assistant", "Hi, I want to cancel my trip."),
                                                         ("user", "Which reservation?")]


# ---------------------------------------------------------------- configuration


def test_missing_data_is_a_clear_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"env.airline.data_dir: .*nowhere is not a directory"):
        AirlineEnv(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="lacks flights.json, reservations.json, users.json"):
        AirlineEnv(tmp_path)
    with pytest.raises(ConfigError, match="needs `airline: {data_dir: DIR}`"):
        load_config(EnvConfig, None, ["name=airline"])
    with pytest.raises(ConfigError, match="user_model"):
        load_config(EnvConfig, None, ["name=airline", "airline.data_dir=x", "airline.user=simulated"])
    with pytest.raises(ConfigError, match="env.airline.user_model: the scripted backend needs a policy"):
        settings = AirlineEnvSettings(data_dir=str(DATA), user="simulated", user_model={"backend": "scripted"})
        build_env(EnvConfig(name="airline", airline=settings))
    with pytest.raises(ConfigError, match=r"env: .*needs `airline: \{data_dir: DIR\}`"):
        load_config(MineConfig, None, ["trajectories=t.jsonl", "env=airline"])


@needs_data
def test_runs_file_defaults_to_the_one_in_the_data_dir(tmp_path):
    for name in ("flights", "reservations", "users"):
        shutil.copy(DATA / f"{name}.json", tmp_path)
    with pytest.raises(ConfigError, match="set env.airline.runs"):
        AirlineEnv(tmp_path)
    shutil.copy(RUNS, tmp_path)
    env = build_env(EnvConfig(name="airline", airline=AirlineEnvSettings(data_dir=str(tmp_path))))
    assert env.task_ids() == [str(t) for t in range(25)]


# ---------------------------------------------------------------- live mining


@needs_data
def test_live_mining_restores_the_cut_and_grounds_drafts_in_real_lookups():
    """Run 14/1 reads the user after a flight change paid by gift card: the live env,
    restored to each cut, must show what GPT-4o saw."""
    from specagent.data.importers import convert_files

    trajectories, _ = convert_files([RUNS], tools_yaml=ROOT / "configs" / "import" / "tau_airline_tools.yaml")
    traj: Trajectory = next(t for t in trajectories if t.id.endswith(":14:1"))
    read_only = classify_tools(traj.tools)

    def next_recorded_step(messages, tools):  # a drafter that writes what GPT-4o wrote
        return traj.messages[len(messages)]

    settings = DraftSettings(max_draft_steps=3)
    mine_cfg = MineConfig(trajectories="-", env="airline", env_data_dir=str(DATA), env_tasks_path=str(RUNS))

    def make() -> AirlineEnv:  # what `specagent mine` builds
        return build_env(mine_cfg.env)

    def jobs_for(t, cuts):
        return live_jobs(make, t, cuts, settings.max_draft_steps, read_only)

    segments = draft_trajectory(traj, ScriptedEngine(next_recorded_step), jobs_for, settings, DraftStats())
    reads = [(seg["cut"], i, s) for seg in segments for i, s in enumerate(seg["steps"]) if s["kind"] == "read"]
    assert len(reads) > 10 and all(seg["labels"] == [1] * len(seg["steps"]) for seg in segments)
    for cut, i, step in reads:
        at = cut + 2 * i + 1  # each drafted read step is one call and one observation
        assert [o["content"] for o in step["observations"]] == [traj.messages[at].content], (cut, i)
    after_write = next(c for c, _, s in reads if s["message"]["tool_calls"][0]["function"]["name"] == "get_user_details")
    restored = restore(make, traj, after_write, read_only)
    assert restored.state_hash() != restored.data.hash(restored.data.fresh_db())  # the change is there
    assert any(seg["steps"] and seg["steps"][-1]["kind"] == StepKind.WRITE.value for seg in segments)


@needs_data
def test_specagent_mine_runs_on_the_live_airline_env(tmp_path, monkeypatch):
    """`specagent mine` with `env: airline`, the drafter replaced by one that writes GPT-4o's steps."""
    from specagent.data import stage
    from specagent.data.importers import convert_files
    from specagent.records.trajectories import write_trajectories

    trajectories, _ = convert_files([RUNS], tools_yaml=ROOT / "configs" / "import" / "tau_airline_tools.yaml")
    chosen = [t for t in trajectories if t.id.endswith((":14:1", ":19:1"))]
    write_trajectories(tmp_path / "trajectories.jsonl", chosen)
    by_request = {t.messages[1].content: t for t in chosen}

    class ScriptedPool:  # stands in for the engines the config names (vLLM)
        def for_roles(self, roles, policy=None):
            return {"drafter": ScriptedEngine(lambda m, tools: by_request[m[1].content].messages[len(m)])}

        def close(self):
            pass

    monkeypatch.setattr(stage, "EnginePool", ScriptedPool)
    cfg = load_config(MineConfig, ROOT / "configs" / "mine" / "airline_smollm2_live.yaml", [
        f"trajectories={tmp_path / 'trajectories.jsonl'}", f"output_dir={tmp_path / 'mined'}",
        f"env_data_dir={DATA}", f"env_tasks_path={RUNS}", "validation_tasks=['19']", "max_cuts_per_trajectory=4",
    ])
    stats = stage.mine_from_config(cfg)
    assert stats["trajectories"] == 2 and stats["all"]["segments"] == 8
    assert stats["all"]["acceptance_rate"] == 1.0  # GPT-4o's own steps, grounded in the live database
    assert "unrecorded" not in stats["all"]["ended_by"]
