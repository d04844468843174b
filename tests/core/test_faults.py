"""Bad input and faults: each one ends in an observation, a repair or a clean stop."""

from __future__ import annotations

import json
import time

import pytest

from specagent.core.errors import ContextLengthExceeded, EngineUnavailable
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, StepStatus, ToolCall
from specagent.engines.scripted import ScriptedEngine, ScriptedVerifier
from specagent.runtime.episodes import read_episodes, run_tasks
from tests.core.toy import ToyEnv


def say(text):
    return lambda messages, tools: Message(role="assistant", content=text)


def call(name, **args):
    return lambda messages, tools: Message(role="assistant", tool_calls=(ToolCall("x", name, args),))


def accept_all(context, steps):
    return len(steps)


def test_malformed_draft_is_never_executed_and_goes_to_repair():
    weak = ScriptedEngine(lambda m, t: (Message(role="assistant", content='<tool_call>{"name": "set"'), "bad json"))
    strong = ScriptedEngine(say("done"))
    verifier = ScriptedVerifier(accept_all)
    ep = run_episode(ToyEnv(), "t0", "specagent", Models(strong, weak, verifier), ProtocolConfig(max_steps=3))
    assert [s.status for s in ep.steps][:2] == [StepStatus.MALFORMED, StepStatus.REPAIRED]
    assert verifier.calls == 0  # nothing verifiable: straight to repair, no wasted prefill
    assert ep.write_calls == []


def test_unknown_tool_counts_as_write_and_is_held():
    env = ToyEnv()
    weak = ScriptedEngine(call("peek", key="a"))  # declared by nobody -> write -> held
    strong = ScriptedEngine(say("done"))
    ep = run_episode(env, "t0", "specagent", Models(strong, weak, ScriptedVerifier(lambda c, s: 0)),
                     ProtocolConfig(max_steps=2))
    assert ep.steps[0].kind.value == "write" and ep.steps[0].status is StepStatus.REJECTED
    assert env.write_log == []


def test_user_allow_list_beats_environment_and_default():
    weak = ScriptedEngine(call("peek", key="a"))
    ep = run_episode(ToyEnv(), "t0", "specagent", Models(ScriptedEngine(say("ok")), weak, ScriptedVerifier(lambda c, s: 0)),
                     ProtocolConfig(max_steps=1, max_draft_steps=2, read_only=("peek",)))
    assert ep.steps[0].kind.value == "read"


def test_user_deny_list_beats_environment_declaration():
    weak = ScriptedEngine(call("get", key="a"))  # the environment says read-only; the user says no
    ep = run_episode(ToyEnv(), "t0", "specagent", Models(ScriptedEngine(say("ok")), weak, ScriptedVerifier(lambda c, s: 0)),
                     ProtocolConfig(max_steps=1, write=("get",)))
    assert ep.steps[0].kind.value == "write"


def test_model_that_never_stops_is_bounded_by_max_steps():
    weak = ScriptedEngine(call("get", key="a"))  # reads forever
    strong = ScriptedEngine(call("list_keys"))
    ep = run_episode(ToyEnv(), "t0", "specagent", Models(strong, weak, ScriptedVerifier(lambda c, s: 1)),
                     ProtocolConfig(max_steps=7, max_draft_steps=3))
    assert ep.stop_reason == "max_steps"
    assert sum(m.role == "assistant" for m in ep.messages) == 7


class FaultyEnv(ToyEnv):
    def execute(self, call):
        if call.name == "get" and call.arguments.get("key") == "boom":
            raise RuntimeError("database on fire")
        if call.name == "get" and call.arguments.get("key") == "slow":
            time.sleep(2)
        return super().execute(call)


@pytest.mark.parametrize("key,expected", [("boom", "failed: RuntimeError: database on fire"), ("slow", "timed out")])
def test_tool_that_raises_or_hangs_becomes_an_error_observation(key, expected):
    weak = ScriptedEngine(call("get", key=key))
    ep = run_episode(FaultyEnv(), "t0", "weak", Models(weak=weak), ProtocolConfig(max_steps=1, tool_timeout_s=0.2))
    observation = ep.messages[-1]
    assert observation.role == "tool" and observation.content.startswith("Error:")
    assert expected in observation.content


class TooLong(ScriptedEngine):
    def chat(self, requests):
        raise ContextLengthExceeded("prompt 3000 tokens + 256 > 2048")


def test_context_overflow_ends_the_episode_cleanly():
    ep = run_episode(ToyEnv(), "t0", "strong", Models(strong=TooLong(say("x"))), ProtocolConfig())
    assert ep.stop_reason.startswith("context_length")


class DiesAfter(ScriptedEngine):
    def __init__(self, n, policy):
        super().__init__(policy)
        self.left = n

    def chat(self, requests):
        if self.left == 0:
            raise EngineUnavailable("server at http://127.0.0.1:9 refused the connection")
        self.left -= 1
        return super().chat(requests)


def test_engine_death_keeps_finished_episodes_and_rerun_resumes(tmp_path):
    out = tmp_path / "episodes.jsonl"
    env = ToyEnv()
    tasks = ["t0", "t1", "t2", "t3"]
    env.task_ids = lambda: tasks
    dying = Models(weak=DiesAfter(5, say("done")))  # each episode here takes two calls
    with pytest.raises(EngineUnavailable):
        run_tasks(env, tasks, ["weak"], dying, ProtocolConfig(), out)
    first = read_episodes(out)
    assert [r["task_id"] for r in first] == ["t0", "t1"]
    with out.open("a") as f:  # a torn line, as a kill mid-write leaves it
        f.write('{"task_id": "t2", "mo')
    records = run_tasks(env, tasks, ["weak"], Models(weak=ScriptedEngine(say("done"))), ProtocolConfig(), out)
    assert [r["task_id"] for r in records] == tasks
    assert [json.loads(line)["task_id"] for line in out.read_text().splitlines()] == tasks
