"""MCP tasks from runs (`specagent env tasks-from-runs`), and the airline tools served over
MCP (`specagent env serve-mcp airline`): a user's logs become tasks that their own server
grades, and GPT-4o's successful runs pass them."""

from __future__ import annotations

import json
import sys

import pytest

from specagent.cli import main
from specagent.config import McpServerSettings
from specagent.core.errors import ConfigError
from specagent.core.types import Message, ToolCall, ToolSpec, Trajectory
from specagent.data.importers import import_trajectories
from specagent.envs.mcp import McpEnv, load_tasks
from specagent.envs.mcp.from_runs import tasks_from_runs
from specagent.records.trajectories import read_trajectories
from tests.envs.test_airline import DATA, ROOT, RUNS, needs_data

TOOLS = [ToolSpec("lookup", "", {"type": "object", "properties": {}}, read_only=True),
         ToolSpec("change", "", {"type": "object", "properties": {}}, read_only=False),
         ToolSpec("mystery", "", {"type": "object", "properties": {}}, read_only=None)]


def run(run_id: str, task_id: str, reward: float | None, calls: list[tuple[str, dict, str]]) -> Trajectory:
    messages = [Message("system", "Policy."), Message("user", "Please help.")]
    for n, (name, arguments, observation) in enumerate(calls):
        messages += [Message("assistant", None, (ToolCall(f"c{n}", name, arguments),)),
                     Message("tool", observation, tool_call_id=f"c{n}")]
    messages += [Message("assistant", "Which one?"), Message("user", "The first."), Message("assistant", "Done.")]
    return Trajectory(run_id, task_id, TOOLS, messages, reward=reward)


def test_gold_actions_are_the_successful_writes_in_order():
    traj = run("r0", "1", 1.0, [("lookup", {"q": 1}, "ok"), ("change", {"x": 1}, "Error: no such x"),
                                ("change", {"x": 2}, "changed"), ("mystery", {}, "done")])
    [task] = tasks_from_runs([traj]).tasks
    # read-only lookups and failed writes are not gold; a tool of unknown kind counts as a write
    assert task["gold_actions"] == [{"name": "change", "arguments": {"x": 2}}, {"name": "mystery", "arguments": {}}]
    assert (task["id"], task["system"], task["request"], task["followups"]) == ("r0", "Policy.", "Please help.",
                                                                                ["The first."])


def test_failed_runs_are_left_out_unknown_rewards_kept_unknown_ids_refused():
    runs = [run("a", "1", 1.0, []), run("b", "1", 0.0, []), run("c", "2", None, []), run("d", "3", 1.0, [])]
    made = tasks_from_runs(runs, task_ids=["1", "2"])
    assert [t["id"] for t in made.tasks] == ["a", "c"]
    assert made.left_out == {"reward below 1": 1, "not in --task-ids": 1}
    assert [t["id"] for t in tasks_from_runs(runs, min_reward=None).tasks] == ["a", "b", "c", "d"]
    with pytest.raises(ConfigError, match="no run of task 9"):
        tasks_from_runs(runs, task_ids=["1", "9"])


def same_text_or_json(a: str, b: str) -> bool:
    """Equal texts, or equal JSON values (an import keeps arguments in sorted key order, so a
    write's echo of them may list the keys in another order than the log)."""
    try:
        return a == b or json.loads(a) == json.loads(b)
    except ValueError:
        return False


@needs_data
def test_gpt4o_successful_runs_pass_their_own_tasks_on_the_airline_mcp_server(tmp_path, capsys):
    """The user's path: import the logs, make tasks of the held-out successful runs, serve the
    tools over MCP. Replaying each recorded run gets the recorded observations and reward 1;
    leaving out its writes gets 0."""
    trajectories = tmp_path / "trajectories.jsonl"
    import_trajectories([str(RUNS)], out=str(trajectories), tools_yaml=ROOT / "configs/import/tau_airline_tools.yaml")
    tasks_file = tmp_path / "tasks.yaml"
    assert main(["env", "tasks-from-runs", str(trajectories), "--task-ids", "20", "21", "24",
                 "-o", str(tasks_file)]) == 0
    assert "runs left out: 88 not in --task-ids, 1 reward below 1" in capsys.readouterr().out
    tasks = load_tasks(tasks_file)
    runs = {t.id: t for t in read_trajectories(trajectories)}
    server = McpServerSettings(name="airline", restart_each_task=True, command=[
        sys.executable, "-m", "specagent", "env", "serve-mcp", "airline", "--data-dir", str(DATA)])
    replayed = [t for t in tasks if t["gold_actions"]][:2] + [t for t in tasks if not t["gold_actions"]][:1]
    with McpEnv([server], tasks, write=["transfer_to_human_agents"],
                terminal_tools=["transfer_to_human_agents"]) as env:
        for task in replayed:
            recorded = runs[task["id"]]
            results = {m.tool_call_id: m.content for m in recorded.messages if m.role == "tool"}
            env.reset(task["id"])
            for message in recorded.messages:
                for call in message.tool_calls:
                    observation = env.execute(call)
                    assert same_text_or_json(observation, results[call.id]), call
            assert env.reward(recorded.messages).reward == 1.0, task["id"]
            if task["gold_actions"]:
                env.reset(task["id"])  # a fresh database: the same lookups without the writes fail the task
                assert env.reward(recorded.messages).reward == 0.0


def test_serve_mcp_airline_needs_its_data_dir_and_the_store_refuses_one(capsys):
    assert main(["env", "serve-mcp", "airline"]) == 2
    assert "airline needs --data-dir" in capsys.readouterr().err
    assert main(["env", "serve-mcp", "builtin", "--data-dir", "x"]) == 2
    assert "--data-dir is for airline" in capsys.readouterr().err
