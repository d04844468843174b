"""MCP environments with the real SDK: a toy server and the built-in store served over
stdio (`specagent env serve-mcp builtin`) and streamable HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import mcp_types as types
import pytest

from specagent.config import EnvConfig, McpEnvSettings, McpServerSettings, RunConfig, load_config
from specagent.core.errors import ConfigError, SpecAgentError, TaskFileError
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, StepStatus, ToolCall
from specagent.engines.scripted import ScriptedEngine, ScriptedVerifier
from specagent.envs.mcp import McpEnv, load_tasks
from specagent.envs.mcp.client import declared_read_only, tool_spec
from specagent.envs.store import StoreEnv
from specagent.envs.store.env import DB_PATH, canonical_hash
from specagent.envs.store.expert import expert_policy
from specagent.envs.store.tools import TOOL_SPECS, run_tool
from specagent.runtime.assembly import build_env

ROOT = Path(__file__).resolve().parents[2]
TOY = McpServerSettings(name="toy", command=[sys.executable, str(Path(__file__).with_name("mcp_toy_server.py"))])
SERVE_STORE = [sys.executable, "-m", "specagent", "env", "serve-mcp", "builtin"]
STORE = McpServerSettings(name="store", command=SERVE_STORE, restart_each_task=True)
TOY_TASKS = [
    {"id": "note", "request": "Note 'x', then say done.", "required_facts": ["done"],
     "gold_actions": [{"name": "add_note", "arguments": {"text": "x"}}]},
    {"id": "chat", "request": "Hello!", "system": "Be brief.", "followups": ["And again?"]},
]  # fmt: skip


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(id="call_0", name=name, arguments=arguments)


@pytest.fixture(scope="module")
def toy():
    with McpEnv([TOY], TOY_TASKS, tool_timeout_s=1.0) as env:
        yield env


# ---------------------------------------------------------------- tools and annotations


def test_tools_and_annotations_are_listed(toy):
    specs = {spec.name: spec for spec in toy.tool_specs()}
    assert set(specs) == {"echo", "slow", "fail", "add_note", "clear_notes"}
    assert specs["echo"].parameters["properties"] == {"text": {"title": "Text", "type": "string"}}
    assert specs["echo"].description == "Say the text back."
    # add_note has no annotation (unknown: write); clear_notes is read-only and destructive at
    # once (not read-only). tool_specs() carries the classification, not the raw hint.
    classified = {"echo": True, "slow": True, "fail": True, "add_note": False, "clear_notes": False}
    assert {name: spec.read_only for name, spec in specs.items()} == classified
    assert toy.read_only == classified


def test_the_users_lists_hold_through_the_python_api():
    """McpEnv(write=[...]) alone, then run_episode with a default ProtocolConfig: the tool the
    server calls read-only is held, because tool_specs() carries the user's classification."""
    with McpEnv([TOY], TOY_TASKS, write=["echo"], tool_timeout_s=1.0) as env:
        assert {s.name: s.read_only for s in env.tool_specs()}["echo"] is False
        weak = ScriptedEngine(lambda m, t: Message("assistant", tool_calls=(call("echo", text="hi"),)))
        strong = ScriptedEngine(lambda m, t: Message("assistant", content="done"))
        ep = run_episode(env, "chat", "specagent", Models(strong, weak, ScriptedVerifier(lambda c, s: 0)),
                         ProtocolConfig(max_steps=1))
        assert ep.steps[0].kind.value == "write" and ep.steps[0].status is StepStatus.REJECTED
        assert env.write_log == []


@pytest.mark.parametrize("spelling", ["readOnlyHint", "read_only_hint"])
def test_both_hint_spellings_are_read(spelling):
    destructive = "destructiveHint" if spelling == "readOnlyHint" else "destructive_hint"
    assert declared_read_only({spelling: True}) is True
    assert declared_read_only({spelling: False}) is False
    assert declared_read_only({spelling: "true"}) is False  # only a literal true is read-only
    assert declared_read_only({spelling: True, destructive: True}) is False
    assert declared_read_only({"title": "no hint"}) is None
    raw = {"name": "t", "inputSchema": {"type": "object"}, "annotations": {spelling: True}}
    assert tool_spec(types.Tool.model_validate(raw)).read_only is True


def test_user_lists_beat_the_server():
    with McpEnv([TOY], read_only=["clear_notes"], write=["echo"]) as env:
        assert env.read_only["echo"] is False  # the server says read-only; the user says write
        assert env.read_only["clear_notes"] is True
        assert env.read_only["add_note"] is False  # unknown means write
        assert env.execute(call("echo", text="hi")) == "hi" and env.write_log == [call("echo", text="hi")]


def test_a_misspelt_user_list_name_is_an_error():
    with pytest.raises(ConfigError, match=r"env\.write: unknown tool\(s\) .ad_note."):
        McpEnv([TOY], write=["ad_note"])


def test_a_tool_name_on_two_servers_is_an_error():
    twin = TOY.model_copy(update={"name": "twin"})
    with pytest.raises(ConfigError, match="tool 'echo' is offered by both 'toy' and 'twin'"):
        McpEnv([TOY, twin])


def test_a_server_that_cannot_start_is_a_config_error():
    broken = McpServerSettings(name="gone", command=["/nonexistent/mcp-server"])
    with pytest.raises(ConfigError, match="MCP server 'gone' .*cannot connect"):
        McpEnv([broken])


# ---------------------------------------------------------------- calls


def test_tool_errors_are_observations(toy):
    assert toy.execute(call("echo", text="hi")) == "hi"
    assert toy.execute(call("fail", message="boom")).endswith("boom")
    assert toy.execute(call("fail", message="boom")).startswith("Error: ")
    assert toy.execute(call("echo", wrong=1)).startswith("Error: ")  # arguments the server rejects
    assert toy.execute(call("no_such_tool")) == "Error: unknown tool 'no_such_tool'"


def test_a_hanging_tool_times_out_and_the_session_survives(toy):
    start = time.perf_counter()
    assert toy.execute(call("slow", seconds=30)) == "Error: tool slow timed out after 1s"
    assert time.perf_counter() - start < 5
    assert toy.execute(call("echo", text="still here")) == "still here"


# ---------------------------------------------------------------- tasks, reward, state hash


def test_reset_gives_system_prompt_request_and_followups(toy):
    assert toy.reset("chat") == [Message("system", "Be brief."), Message("user", "Hello!")]
    assert toy.user_turn("hi") == "And again?" and toy.user_turn("bye") is None
    # without a system prompt of its own, the task gets the server's instructions
    assert toy.reset("note")[0] == Message("system", "You are the toy agent.")


def test_reward_from_gold_checks_and_state_hash_from_writes(toy):
    toy.reset("note")
    empty = toy.state_hash()
    toy.execute(call("echo", text="reads leave no trace"))
    assert toy.state_hash() == empty
    toy.execute(call("add_note", text="x"))
    done = [Message("assistant", "Done.")]
    assert toy.reward(done).reward == 1.0
    assert toy.reward([Message("assistant", "ok")]).info["missing_facts"] == ["done"]
    after_one = toy.state_hash()
    toy.execute(call("add_note", text="x"))
    result = toy.reward(done)
    assert result.reward == 0.0 and result.info["writes_match"] is False
    assert len({empty, after_one, toy.state_hash()}) == 3
    toy.reset("note")
    toy.execute(call("add_note", text="x"))
    assert toy.state_hash() == after_one  # the same writes hash alike


def test_a_task_without_checks_has_unknown_reward(toy):
    toy.reset("chat")
    result = toy.reward([Message("assistant", "Hi.")])
    assert result.reward == 0.0 and result.info["checked"] is False
    assert "no gold checks" in result.info["reason"]


def test_gold_actions_must_name_a_write_tool():
    task = {"id": "t", "request": "r", "gold_actions": [{"name": "echo", "arguments": {"text": "x"}}]}
    with pytest.raises(TaskFileError, match=r"task t: gold_actions\[0\] expects a write, but 'echo' counts as read"):
        McpEnv([TOY], [task])


def test_task_files_yaml_and_jsonl(tmp_path):
    good = tmp_path / "tasks.yaml"
    good.write_text("- {id: 1, request: hi, required_facts: [x]}\n- {id: b, request: yo, system: be kind}\n")
    assert [t["request"] for t in load_tasks(good)] == ["hi", "yo"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {id: 1, request: hi}\n- {id: 2, followups: [a]}\n")
    with pytest.raises(TaskFileError, match=r"bad.yaml: task 1: missing required key\(s\) request"):
        load_tasks(bad)
    lines = tmp_path / "tasks.jsonl"
    lines.write_text('{"id": 1, "request": "hi"}\n{"id": 2, "request": "yo", "gold_actions": [{"arguments": {}}]}\n')
    with pytest.raises(TaskFileError, match=r"tasks.jsonl:2: gold_actions must be a list of \{name, arguments\}"):
        load_tasks(lines)
    assert len(load_tasks(ROOT / "specagent" / "envs" / "store" / "tasks.jsonl")) == len(StoreEnv().task_ids())


def test_server_settings_are_validated():
    with pytest.raises(ValueError, match="exactly one of `command`"):
        McpServerSettings(name="s")
    with pytest.raises(ValueError, match="exactly one of `command`"):
        McpServerSettings(name="s", command=["x"], url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="restart_each_task needs a stdio"):
        McpServerSettings(name="s", url="http://127.0.0.1:1/mcp", restart_each_task=True)
    with pytest.raises(ValueError, match="server names must be unique"):
        McpEnvSettings(servers=[TOY, TOY])
    with pytest.raises(ConfigError, match="needs a task file"):
        build_env(EnvConfig(name="mcp", mcp=McpEnvSettings(servers=[TOY])))


# ---------------------------------------------------------------- the store over MCP, through the protocol


def accept_all(context, steps) -> int:
    return len(steps)


def specagent_episode(env, task_id: str, verifier=None, write: tuple[str, ...] = ()):
    expert = ScriptedEngine(expert_policy(env))
    models = Models(strong=expert, weak=expert, verifier=verifier or ScriptedVerifier(accept_all))
    return run_episode(env, task_id, "specagent", models, ProtocolConfig(max_steps=16, write=write))


def test_the_store_over_mcp_runs_like_the_store_in_process():
    store_ids = ["lookup_01", "single_write_01", "policy_forbids_01", "multi_write_03", "single_write_01"]
    with McpEnv([STORE], load_tasks(ROOT / "specagent" / "envs" / "store" / "tasks.jsonl")) as remote:
        assert {s.name: s.read_only for s in remote.tool_specs()} == {s.name: s.read_only for s in TOOL_SPECS}
        for task_id in store_ids:  # single_write_01 twice: the restarted server has a fresh database
            local_env = StoreEnv()
            local, over_mcp = specagent_episode(local_env, task_id), specagent_episode(remote, task_id)
            assert over_mcp.messages == local.messages
            assert over_mcp.reward == local.reward == 1.0
            assert over_mcp.write_calls == local.write_calls
            replayed = json.loads(DB_PATH.read_text())
            for write in remote.write_log:
                run_tool(replayed, write.name, write.arguments)
            assert canonical_hash(replayed) == local.final_hash


def order_status(env: McpEnv, order_id: str) -> str:
    return json.loads(env.execute(call("get_order_details", order_id=order_id)))["status"]


@pytest.mark.parametrize("user_says_write", [True, False])
def test_the_users_write_list_beats_a_lying_server(user_says_write):
    """The server declares cancel_pending_order read-only. With the user's `write:` list the
    protocol holds the cancel until the verifier approves it; trusting the server, the weak
    model's draft cancels the order before anyone has reviewed it."""
    write = ("cancel_pending_order",) if user_says_write else ()
    liar = STORE.model_copy(update={"command": [*SERVE_STORE, "--lie", "cancel_pending_order"]})
    task = StoreEnv().task("single_write_02")  # lookups, then cancel order W1012, then reply
    if not user_says_write:  # the cancel counts as a lookup: a gold write on it would be refused
        task = {**task, "expert_lookups": task["expert_lookups"] + task["gold_actions"], "gold_actions": []}
    with McpEnv([liar], [task], write=write) as env:
        # the server's hint, and the classification tool_specs() carries
        cancel_spec = next(s for s in env.tool_specs() if s.name == "cancel_pending_order")
        assert cancel_spec.read_only is (not user_says_write)
        status_at_review = []

        def judge(context, steps) -> int:
            if any("cancel_pending_order" in step.tool_names for step in steps):
                status_at_review.append(order_status(env, "W1012"))
            return len(steps)

        episode = specagent_episode(env, "single_write_02", ScriptedVerifier(judge), write)
        assert episode.reward == 1.0 and order_status(env, "W1012") == "cancelled"
        if user_says_write:
            assert status_at_review == ["pending"]  # held: nothing was written before approval
            cancel = next(s for s in episode.steps if s.tools == ("cancel_pending_order",))
            assert cancel.status is StepStatus.HELD_APPROVED
        else:
            assert status_at_review == ["cancelled"]  # executed while drafting, before review
            assert env.write_log == []  # and not even counted as a write


def test_the_shipped_run_config_runs_the_store_over_mcp(tmp_path):
    config = ROOT / "configs" / "run" / "store_mcp_scripted.yaml"
    assert load_config(RunConfig, config).env.mcp.servers[0].command[:3] == ["python", "-m", "specagent"]
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "specagent", "run", "-c", str(config), f"output_dir={out}", "env.limit=2"],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)  # fmt: skip
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [(e["task_id"], e["reward"]) for e in episodes] == [("lookup_01", 1.0), ("single_write_01", 1.0)]


def test_an_interrupted_episode_on_a_stateful_server_is_not_rerun_unasked(tmp_path):
    """A server that keeps its state (no restart_each_task) may hold the writes of an episode
    a killed run left unfinished: the resume stops and names it until its journal line is
    deleted. A server restarted per task keeps no journal: a fresh state each time."""
    from specagent.runtime.run import run_from_config

    config = ROOT / "configs" / "run" / "store_mcp_scripted.yaml"
    out = tmp_path / "run"
    servers = 'env.mcp.servers=[{"name": "store", "command": ["python", "-m", "specagent", "env", "serve-mcp", "builtin"]}]'
    stateful = load_config(RunConfig, config, [f"output_dir={out}", "env.limit=2", servers])
    run_from_config(stateful)
    journal = out / "episodes.started.jsonl"
    assert [json.loads(line) for line in journal.read_text().splitlines()] == [
        {"task_id": "lookup_01", "arm": "specagent", "trial": 0},
        {"task_id": "single_write_01", "arm": "specagent", "trial": 0}]
    with journal.open("a") as f:  # as a run killed mid-episode leaves it: started, never finished
        f.write(json.dumps({"task_id": "policy_forbids_01", "arm": "specagent", "trial": 0}) + "\n")
    more = load_config(RunConfig, config, [f"output_dir={out}", "env.limit=3", servers])
    with pytest.raises(SpecAgentError, match=r"1 episode\(s\) started and never finished: task policy_forbids_01"):
        run_from_config(more)
    journal.write_text("".join(line + "\n" for line in journal.read_text().splitlines()[:2]))
    run_from_config(more)  # the user looked and deleted the line: it runs
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 3
    fresh = tmp_path / "fresh"
    run_from_config(load_config(RunConfig, config, [f"output_dir={fresh}", "env.limit=1"]))
    assert not (fresh / "episodes.started.jsonl").exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_store_over_streamable_http():
    port = free_port()
    server = subprocess.Popen([*SERVE_STORE, "--http", str(port)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not listening(port):
            assert server.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.2)
        url = McpServerSettings(name="store", url=f"http://127.0.0.1:{port}/mcp")
        with McpEnv([url]) as env:
            assert env.read_only["cancel_pending_order"] is False and env.read_only["get_order_details"] is True
            cancel = call("cancel_pending_order", order_id="W1012", reason="ordered by mistake")
            assert json.loads(env.execute(cancel))["status"] == "cancelled"
            assert env.execute(cancel) == "Error: order W1012 is cancelled; only pending orders can be cancelled"
            assert env.write_log == [cancel]  # the refused second cancel changed nothing
    finally:
        server.terminate()
        server.wait(timeout=30)
