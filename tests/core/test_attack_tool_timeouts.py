"""Class 4 attacks: slow and hung tools, at concurrency 1, 4 and 16.

A timeout counts from the call's start. A call that timed out did start: if it writes, its
effect is unknown, the episode records it (`unknown_effects`) and stops, and the environment
it runs in is replaced before the next episode, so a late write never lands in another
episode's state. Every write that ran is in its episode's write log; a call reported as not
executed never runs."""

from __future__ import annotations

import threading
import time

import pytest

from specagent.core.protocol import NOT_RUN, Models, ProtocolConfig, run_episode
from specagent.core.types import Message, ToolCall
from specagent.engines.batching import batching_engines
from specagent.engines.scripted import ScriptedEngine, ScriptedVerifier
from specagent.runtime.episodes import read_episodes, run_tasks
from tests.core.toy import ToyEnv

TIMEOUT = 0.2
EFFECTS: list[dict] = []  # every write that really changed some environment's state
EFFECTS_LOCK = threading.Lock()


class SlowEnv(ToyEnv):
    """The toy domain with slow tools: task `hang-*` writes take 3x the timeout, `slow-*` reads
    of key `a` take 2x; everything else is quick. Each write records where its effect landed."""

    def __init__(self) -> None:
        super().__init__()
        self.episode = 0  # bumped by every reset: which episode the state belongs to
        self.task = ""

    def task_ids(self):
        return [f"{kind}-{n}" for n in range(6) for kind in ("hang", "slow", "quick")]

    def reset(self, task_id):
        self.episode += 1
        self.task = task_id
        return super().reset(task_id)

    def execute(self, call: ToolCall) -> str:
        started = (self.episode, self.task)
        if call.name in ("set", "delete") and self.task.startswith("hang"):
            time.sleep(3 * TIMEOUT)
        if call.name == "get" and call.arguments.get("key") == "a" and self.task.startswith("slow"):
            time.sleep(2 * TIMEOUT)
        if call.name in ("set", "delete"):
            with EFFECTS_LOCK:
                EFFECTS.append({"env": id(self), "started": started, "landed": (self.episode, self.task),
                                "call": call.name, "key": call.arguments.get("key")})
        return super().execute(call)


def strong_policy(messages, tools):
    """Look up, write twice in one step (the second call must never run after a hang), reply."""
    done = sum(m.role == "assistant" for m in messages)
    if done == 0:
        return Message("assistant", tool_calls=(ToolCall("x", "get", {"key": "a"}),))
    if done == 1:
        return Message("assistant", tool_calls=(ToolCall("x", "set", {"key": "a", "value": 7}),
                                                 ToolCall("y", "delete", {"key": "b"})))
    return Message("assistant", content="done")


def weak_policy(messages, tools):
    return Message("assistant", tool_calls=(ToolCall("x", "get", {"key": "c"}),))


@pytest.mark.parametrize("concurrency", [1, 4, 16])
@pytest.mark.parametrize("mode", ["strong", "specagent"])
def test_no_write_runs_unlogged_or_lands_in_another_episode(tmp_path, concurrency, mode):
    EFFECTS.clear()
    engines = batching_engines({"strong": ScriptedEngine(strong_policy, "strong"),
                                "weak": ScriptedEngine(weak_policy, "weak")})
    models = Models(engines["strong"], engines["weak"], ScriptedVerifier(lambda c, s: 0))
    env = SlowEnv()
    out = tmp_path / "episodes.jsonl"
    config = ProtocolConfig(max_steps=6, max_draft_steps=2, tool_timeout_s=TIMEOUT)
    run_tasks(env, env.task_ids(), [mode], models, config, out,
              concurrency=concurrency, env_factory=SlowEnv)
    time.sleep(4 * TIMEOUT)  # let every hung call finish: a late effect must show up now if it ever will
    records = {r["task_id"]: r for r in read_episodes(out)}
    assert len(records) == len(env.task_ids())
    for effect in EFFECTS:
        assert effect["landed"] == effect["started"], effect  # never in another episode's state
        assert effect["call"] in records[effect["started"][1]]["write_calls"]  # every write that ran is logged
    for task, record in records.items():
        not_run = [m for m in record["messages"] if m["role"] == "tool" and m["content"] == NOT_RUN]
        if task.startswith("hang"):
            assert record["stop_reason"] == "tool_timeout:set (effect unknown)"
            assert len(not_run) == 1 and not any(e["started"][1] == task and e["call"] == "delete" for e in EFFECTS)
        else:
            assert record["reward"] == 1.0 and not not_run and record["stop_reason"] == "user_done"
    hung = [e for e in EFFECTS if e["started"][1].startswith("hang")]
    assert len(hung) == 6  # the hung writes did run (late), each in its own discarded environment


def test_the_timeout_counts_from_the_calls_start_not_from_a_queue():
    """Sixteen episodes each block a tool call for most of the timeout at once: with a shared
    pool, later calls would wait in its queue and time out before they ran."""
    barrier = threading.Barrier(16)
    timeout = 1.5  # a second of headroom: a loaded CI box delays threads by tens of milliseconds

    class Busy(ToyEnv):
        def execute(self, call):
            if call.name == "get":
                barrier.wait(timeout=5)  # all 16 calls run at once, or none gets past here
                time.sleep(0.5)
            return super().execute(call)

    results = []

    def one():
        ep = run_episode(Busy(), "t0", "strong", Models(strong=ScriptedEngine(strong_policy)),
                         ProtocolConfig(max_steps=3, tool_timeout_s=timeout))
        results.append(ep)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all("timed out" not in (m.content or "") for ep in results for m in ep.messages)
    assert all(ep.reward == 1.0 for ep in results)


def test_a_timed_out_lookup_while_drafting_is_an_observation_and_drafting_goes_on():
    class SlowGet(ToyEnv):
        def execute(self, call):
            if call.name == "get" and call.arguments.get("key") == "c":
                time.sleep(2 * TIMEOUT)
            return super().execute(call)

    env = SlowGet()
    ep = run_episode(env, "t0", "specagent",
                     Models(ScriptedEngine(strong_policy), ScriptedEngine(weak_policy), ScriptedVerifier(lambda c, s: 0)),
                     ProtocolConfig(max_steps=3, max_draft_steps=2, tool_timeout_s=TIMEOUT))
    assert ep.steps[0].kind.value == "read" and ep.steps[1].kind.value == "read"  # two lookups drafted
    assert ep.tools_still_running == [] or set(ep.tools_still_running) == {"get"}
    assert ep.unknown_effects == []  # a lookup has no effect to be unsure of


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_tool_that_stops_the_process_stops_the_episode_not_a_key_error(stop):
    """Ctrl-C or sys.exit inside a tool is raised in the episode's thread as it would be without
    the tool thread (an exception that is not an `Exception` is no observation)."""
    from specagent.core.execution import ToolRunner

    def execute(call):
        raise stop

    with pytest.raises(stop):
        ToolRunner(execute, TIMEOUT).run(ToolCall("c1", "set", {"key": "a", "value": 1}))
