"""The service behind `specagent serve`, in process, on the scripted config: a chat turn runs
the protocol until the reply to the user, holds a write until the scripted verifier approves
it, and continues a conversation from its replayed state."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from specagent.config import ServeConfig, load_config
from specagent.core.types import Message
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store.env import POLICY
from specagent.envs.store.expert import expert_policy
from specagent.serve.service import Service, UnknownTask

ROOT = Path(__file__).resolve().parents[2]
TASK = "single_write_01"  # look the user up, look the order up, cancel it, tell the user
CALLS = ["find_user_id_by_email", "get_order_details", "cancel_pending_order"]


@pytest.fixture
def service():
    service = Service(load_config(ServeConfig, ROOT / "configs" / "serve" / "store_scripted.yaml"))
    yield service
    service.close()


def request(service: Service, task_id: str = TASK) -> list[Message]:
    return [Message("user", service.env.task(task_id)["request"])]


def test_a_turn_runs_tools_server_side_until_the_reply_to_the_user(service):
    turn = service.chat(request(service))
    assert turn.episode.stop_reason == "user_done"
    assert turn.reply.content == service.env.task(TASK)["expert_reply"]
    assert turn.episode.messages[0] == Message("system", POLICY)  # the environment's policy leads
    calls = turn.executed_calls()
    assert [(c["name"], c["read_only"]) for c in calls] == list(zip(CALLS, [True, True, False]))
    assert '"status":"cancelled"' in calls[2]["observation"]
    held = [s for s in turn.episode.steps if s.kind.value == "write"]
    assert [(s.source, s.status.value) for s in held] == [("weak", "held_approved")]
    env = service.conversations[turn.conversation_id].env
    assert env.state_hash() == env.gold_hash(TASK)


def test_a_write_the_verifier_rejects_is_never_executed(service):
    expert = expert_policy(service.env)

    def reckless(messages, tools):  # the expert, but it cancels for the wrong reason
        step = expert(messages, tools)
        if step.tool_calls and step.tool_calls[0].name == "cancel_pending_order":
            call = step.tool_calls[0]
            wrong = replace(call, arguments={**call.arguments, "reason": "ordered by mistake"})
            step = replace(step, tool_calls=(wrong,))
        return step

    service.models = replace(service.models, weak=ScriptedEngine(reckless))
    turn = service.chat(request(service))
    fates = [(s.source, s.kind.value, s.status.value) for s in turn.episode.steps]
    assert ("weak", "write", "rejected") in fates and ("strong", "write", "repaired") in fates
    env = service.conversations[turn.conversation_id].env
    assert [c.arguments["reason"] for c in env.write_log] == ["no longer needed"]  # only the repair ran
    assert turn.reply.content == service.env.task(TASK)["expert_reply"]


def test_the_next_turn_continues_the_servers_own_state(service):
    first = service.chat(request(service))
    history = [*request(service), *first.new_messages, Message("user", "Thanks!")]
    second = service.chat(history, conversation_id=first.conversation_id)
    assert second.reply.content == "Is there anything else I can help with?"
    assert second.executed_calls() == []
    env = service.conversations[first.conversation_id].env
    # the conversation's write ran once, in the first turn; nothing was replayed
    assert [c.name for c in env.write_log] == ["cancel_pending_order"]
    assert env.state_hash() == env.gold_hash(TASK)


def test_a_system_message_from_the_client_replaces_the_policy(service):
    turn = service.chat([Message("system", "Be brief."), *request(service)])
    assert [m.content for m in turn.episode.messages if m.role == "system"] == ["Be brief."]


def test_unknown_tasks_are_refused_before_anything_runs(service):
    with pytest.raises(UnknownTask, match="'nope'"):
        service.run_episode("nope")
    with pytest.raises(UnknownTask, match="'nope'"):
        service.chat(request(service), task_id="nope")
    assert service.metrics.to_json()["episodes"] == service.metrics.to_json()["chat_turns"] == 0
