"""A scripted perfect agent for the store domain: the reference trajectory of each task."""

from __future__ import annotations

import copy
from typing import Any, Sequence

from specagent.core.types import Message, ToolCall
from specagent.envs.store.env import StoreEnv


def _call_message(number: int, action: dict[str, Any]) -> Message:
    call = ToolCall(id=f"call_{number}", name=action["name"], arguments=copy.deepcopy(action["arguments"]))
    return Message(role="assistant", content=None, tool_calls=(call,))


def _fallback_reply(task: dict[str, Any]) -> str:
    """For task files without ``expert_reply``: a reply that states every required fact."""
    facts = "; ".join(task["required_facts"])
    return f"All done. Summary: {facts}." if facts else "All done."


def _asked(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The withheld details in the order the expert asks for them (by ``after``, then as listed)."""
    return sorted(task.get("withheld", []), key=lambda detail: detail["after"])


def expert_steps(env: StoreEnv, task_id: str) -> list[Message]:
    """The assistant messages a perfect agent sends, one tool call each, then the final reply.

    Lookups come from the task's ``expert_lookups`` (none if absent), then each gold
    action in order; the final message is ``expert_reply`` or a summary of the facts.
    Each withheld detail of the env's user mode is asked for (its ``question``, a message
    to the user) before the call numbered ``after``; the user's answer comes between.
    Tool call ids are "call_0", "call_1", ... in order.
    """
    task = env.task(task_id)
    actions = list(task.get("expert_lookups", [])) + list(task["gold_actions"])
    questions = _asked(task)
    messages = []
    for number, action in enumerate(actions):
        messages += [Message(role="assistant", content=d["question"]) for d in questions if d["after"] == number]
        messages.append(_call_message(number, action))
    messages += [Message(role="assistant", content=d["question"]) for d in questions if d["after"] >= len(actions)]
    messages.append(Message(role="assistant", content=task.get("expert_reply") or _fallback_reply(task)))
    return messages


def _task_for(env: StoreEnv, candidates: list[str], answers: Sequence[str]) -> str | None:
    """The first candidate task whose withheld details' answers match the user's later messages.

    Tasks can share an opening (multi_turn user mode hides who and which order); the expert
    asks the same questions for all of them until an answer tells them apart. Messages past
    the answers (scripted follow-ups) are not compared.
    """
    for task_id in candidates:
        expected = [d["answer"] for d in _asked(env.task(task_id))]
        if all(said == answer for said, answer in zip(answers, expected)):
            return task_id
    return None


def expert_policy(env: StoreEnv):
    """A scripted model (for `ScriptedEngine`) that plays the expert of whichever task the
    conversation is about: the task is found by its opening request (and, where openings
    are shared, by the user's answers), the step by the number of assistant turns so far."""
    by_opening: dict[str, list[str]] = {}
    for task_id in env.task_ids():
        by_opening.setdefault(env.task(task_id)["request"], []).append(task_id)

    def policy(messages, tools):
        said = [m.content for m in messages if m.role == "user"]
        task_id = _task_for(env, by_opening.get(said[0], []), said[1:]) if said else None
        if task_id is None:
            return Message(role="assistant", content="Sorry, I cannot help with that.")
        steps = expert_steps(env, task_id)
        done = sum(1 for m in messages if m.role == "assistant")
        if done < len(steps):
            return steps[done]
        return Message(role="assistant", content="Is there anything else I can help with?")

    return policy
