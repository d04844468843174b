"""The airline conformance check cannot pass quietly: hostile runs files, built in tmp_path
on a small database, and the counts, messages and exit codes they must give."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from specagent.envs.airline.conformance import main
from specagent.envs.airline.data import data_hash
from specagent.envs.airline.tools import TERMINAL_TOOLS, run_tool
from tests.helpers.airline import fresh, tiny_database

POLICY = "# Airline Agent Policy (test)"
CANCEL = {"user_id": "bob_kim_2", "instruction": "Cancel reservation RES003.", "outputs": [],
          "actions": [{"name": "cancel_reservation", "kwargs": {"reservation_id": "RES003"}}]}
PRICE = {"user_id": "ann_lee_1", "instruction": "How much did RES001 cost?", "outputs": ["210"],
         "actions": [{"name": "get_reservation_details", "kwargs": {"reservation_id": "RES001"}}]}


def make_run(task_id: int, trial: int, task: dict[str, Any], calls: list[tuple[str, dict[str, Any]]],
             said: str = "Done.", graded: bool = True) -> dict[str, Any]:
    """A run as tau-bench records it: the calls made on a fresh database, their observations,
    the final message, and tau-bench's grading (reward_info) unless ``graded`` is False."""
    db = fresh()
    traj: list[dict[str, Any]] = [{"role": "system", "content": POLICY},
                                  {"role": "user", "content": task["instruction"]}]
    for number, (name, arguments) in enumerate(calls):
        call_id = f"call_{trial}_{number}"
        traj.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        traj.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": run_tool(db, name, arguments)})
    traj.append({"role": "assistant", "content": said})
    gold_db = fresh()
    for action in task["actions"]:
        if action["name"] not in TERMINAL_TOOLS:
            run_tool(gold_db, action["name"], action["kwargs"])
    gold, final = data_hash(gold_db), data_hash(db)
    if task["outputs"]:
        found = {o: o.lower() in said.lower().replace(",", "") for o in task["outputs"]}
        reward = 1.0 if final == gold and all(found.values()) else 0.0
        info: dict[str, Any] = {"r_outputs": 1.0 if all(found.values()) else 0.0, "outputs": found}
    else:
        reward = 1.0 if final == gold else 0.0
        info = {"r_actions": reward, "gt_data_hash": gold}
    reward_info = {"reward": reward, "info": info, "actions": task["actions"]} if graded else None
    return {"task_id": task_id, "trial": trial, "reward": reward if graded else 0.0, "traj": traj,
            "info": {"task": task, "source": "user", "user_cost": 0.0, "reward_info": reward_info}}


def clean_runs() -> list[dict[str, Any]]:
    return [
        make_run(0, 0, CANCEL, [("cancel_reservation", {"reservation_id": "RES003"})]),  # solved
        make_run(0, 1, CANCEL, [("get_user_details", {"user_id": "bob_kim_2"})]),  # changed nothing: 0.0
        make_run(1, 0, PRICE, [("get_reservation_details", {"reservation_id": "RES001"})], said="It cost $210."),
    ]


def conformance(tmp_path: Path, runs: list[Any], capsys, *options: str) -> tuple[int, str]:
    """Write the tiny database and ``runs`` into tmp_path, run the check: (exit code, output)."""
    for name, section in tiny_database().items():
        (tmp_path / f"{name}.json").write_text(json.dumps(section))
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    code = main(["--data", str(tmp_path), "--runs", str(tmp_path / "runs.json"), *options])
    out, err = capsys.readouterr()
    return code, out + err


def summary(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("summary"))


def test_clean_runs_pass_and_every_kind_is_counted(tmp_path, capsys):
    code, out = conformance(tmp_path, clean_runs(), capsys)
    assert code == 0, out
    assert summary(out) == ("summary (checked/skipped/failed): records 3/0/0; tool calls 3/0/0; gold hash 2/0/0; "
                            "final database 3/0/0; outputs 1/0/0; reward 3/0/0; tasks 2/0/0 (skipped: unchecked)")
    assert "tasks: 2: gold hash confirmed for 2 (1 by a recorded gt_data_hash; 1 by a run whose final database " \
           "matched); failed: none; unchecked: none" in out
    assert out.rstrip().endswith("result: PASS")


def test_a_run_without_reward_info_is_counted_and_listed_with_why(tmp_path, capsys):
    runs = clean_runs() + [make_run(0, 2, CANCEL, [("get_user_details", {"user_id": "bob_kim_2"})], graded=False)]
    code, out = conformance(tmp_path, runs, capsys)
    assert code == 0, out  # its calls are checked; what tau-bench never graded is skipped, not failed
    assert "runs: 4" in out
    assert summary(out).startswith("summary (checked/skipped/failed): records 4/0/0; tool calls 4/0/0; "
                                   "gold hash 2/1/0; final database 3/1/0; outputs 1/0/0; reward 3/1/0;")
    assert ("  - run [3] (task 0, trial 2): gold hash, final database, reward skipped: tau-bench never graded it "
            "(no info.reward_info") in out


def test_a_task_no_run_confirms_fails_unless_allowed(tmp_path, capsys):
    runs = [make_run(0, 0, CANCEL, [("cancel_reservation", {"reservation_id": "RES003"})], graded=False),
            make_run(1, 0, PRICE, [], said="I cannot tell.")]  # missed its output: its reward says nothing of the db
    code, out = conformance(tmp_path, runs, capsys)
    assert code == 1, out
    assert "tasks 0/2/0" in summary(out) and "unchecked: 0, 1" in out
    assert "result: FAIL: 2 task(s) unchecked: 0, 1" in out and "--allow-unchecked" in out
    assert "run [1] (task 1, trial 0): final database skipped: its record does not say" in out
    code, out = conformance(tmp_path, runs, capsys, "--allow-unchecked")
    assert code == 0, out
    assert "result: PASS, with 2 task(s) unchecked (allowed): 0, 1" in out


def test_a_wrong_recorded_observation_fails_named_by_run_and_message(tmp_path, capsys):
    runs = clean_runs()
    runs[1]["traj"][3]["content"] = runs[1]["traj"][3]["content"].replace('"Bob"', '"Rob"')
    code, out = conformance(tmp_path, runs, capsys)
    assert code == 1, out
    assert "tool calls 3/0/1" in summary(out) and "result: FAIL: 1 check(s) failed" in out
    assert "  - run [1] (task 0, trial 1), message 2, get_user_details: differs at character" in out
    assert "recorded '" in out and "Rob" in out


def test_recorded_outputs_and_final_database_are_compared_per_run(tmp_path, capsys):
    """Records whose reward still agrees: only the per-run checks notice them."""
    task = dict(PRICE, outputs=["210", "999"])
    outputs_run = make_run(1, 0, task, [], said="It cost 210.")  # one output of two: reward 0
    outputs_run["info"]["reward_info"]["info"]["outputs"] = {"210": False, "999": False}
    database_run = make_run(0, 1, CANCEL, [])  # changed nothing: reward 0, r_actions 0
    database_run["info"]["reward_info"]["info"]["r_actions"] = 1.0
    code, out = conformance(tmp_path, [make_run(0, 0, CANCEL, [("cancel_reservation", {"reservation_id": "RES003"})]),
                                       database_run, outputs_run], capsys)
    assert code == 1, out
    # the outputs run missed an output: its record cannot say whether its database matched
    assert "final database 2/1/1" in summary(out) and "outputs 1/0/1" in summary(out)
    assert "reward 3/0/0" in summary(out) and "tasks 1/1/1" in summary(out)  # task 0 failed, task 1 unchecked
    assert ("  - run [1] (task 0, trial 1): recorded that its final database matched the gold one; replayed, "
            "it does not") in out
    assert ("  - run [2] (task 1, trial 0): recorded outputs {'210': False, '999': False}, re-graded "
            "{'210': True, '999': False}") in out


def bad_arguments(text: str):
    def spoil(runs):
        runs[0]["traj"][2]["tool_calls"][0]["function"]["arguments"] = text
    return spoil


def drop(key: str, message: int | None = None):
    def spoil(runs):
        del (runs[0] if message is None else runs[0]["traj"][message])[key]
    return spoil


def disagreeing_reward(runs):
    runs[0]["info"]["reward_info"]["reward"] = 0.0


@pytest.mark.parametrize(("spoil", "failure"), [
    (bad_arguments('{"reservation_id": "RES003"'), "run [0] (task 0, trial 0), message 2, tool call 0 "
     "(cancel_reservation): arguments are not valid JSON (Expecting ',' delimiter: line 1 column 28 (char 27)): "
     "'{\"reservation_id\": \"RES003\"'"),
    (bad_arguments('["RES003"]'), "run [0] (task 0, trial 0), message 2, tool call 0 (cancel_reservation): "
     "arguments are not a JSON object: ['RES003']"),
    (drop("role", message=2), "run [0] (task 0, trial 0), message 2: not a message with a role"),
    (drop("tool_call_id", message=3), "run [0] (task 0, trial 0), message 3: a tool message without a tool_call_id"),
    (drop("traj"), "run [0] (task 0, trial 0): lacks traj"),
    (drop("task_id"), "run [0]: lacks task_id"),
    (disagreeing_reward, "run [0] (task 0, trial 0): records reward 1.0 but reward_info.reward 0.0"),
])
def test_a_bad_record_is_a_failure_named_by_run_not_a_traceback(tmp_path, capsys, spoil, failure):
    runs = clean_runs()
    spoil(runs)
    code, out = conformance(tmp_path, runs, capsys)
    assert code == 1, out
    assert "Traceback" not in out
    assert f"records failures (1):\n  - {failure}" in out
    assert "records 3/0/1" in summary(out)
    assert "run [0]" in out.split("runs with skipped checks")[1]  # its later checks are listed as skipped
    assert "result: FAIL: 1 check(s) failed" in out


def test_bad_records_do_not_stop_the_other_runs(tmp_path, capsys):
    runs = clean_runs() + [copy.deepcopy(clean_runs()[0]), "not a run"]
    runs[3]["traj"][2]["tool_calls"][0]["function"]["arguments"] = "{oops"
    code, out = conformance(tmp_path, runs, capsys)
    assert code == 1, out
    assert "runs: 5" in out and "records 5/0/2" in summary(out)
    assert "tool calls 3/1/0" in summary(out)  # the bad call is not replayed, and said so
    assert "run [4]: is not a JSON object but str" in out
    assert "tasks 2/0/0" in summary(out)  # the good runs still confirm both tasks


def test_data_that_cannot_be_loaded_exits_2(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nowhere")]) == 2
    assert "env.airline.data_dir" in capsys.readouterr().err
    code, out = conformance(tmp_path, [], capsys)
    assert code == 2 and "non-empty JSON list" in out
