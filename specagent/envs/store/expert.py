"""A scripted perfect agent for the store domain: the reference trajectory of each task."""

from __future__ import annotations

import copy
from typing import Any

from specagent.core.types import Message, ToolCall
from specagent.envs.store.env import StoreEnv


def _call_message(number: int, action: dict[str, Any]) -> Message:
    call = ToolCall(id=f"call_{number}", name=action["name"], arguments=copy.deepcopy(action["arguments"]))
    return Message(role="assistant", content=None, tool_calls=(call,))


def _fallback_reply(task: dict[str, Any]) -> str:
    """For task files without ``expert_reply``: a reply that states every required fact."""
    facts = "; ".join(task["required_facts"])
    return f"All done. Summary: {facts}." if facts else "All done."


def expert_steps(env: StoreEnv, task_id: str) -> list[Message]:
    """The assistant messages a perfect agent sends, one tool call each, then the final reply.

    Lookups come from the task's ``expert_lookups`` (none if absent), then each gold
    action in order; the final message is ``expert_reply`` or a summary of the facts.
    Tool call ids are "call_0", "call_1", ... in order.
    """
    task = env.task(task_id)
    actions = list(task.get("expert_lookups", [])) + list(task["gold_actions"])
    messages = [_call_message(number, action) for number, action in enumerate(actions)]
    messages.append(Message(role="assistant", content=task.get("expert_reply") or _fallback_reply(task)))
    return messages


def expert_policy(env: StoreEnv):
    """A scripted model (for `ScriptedEngine`) that plays the expert of whichever task the
    conversation is about: the task is found by its opening request, the step by the
    number of assistant turns so far."""
    by_request = {env.task(t)["request"]: t for t in env.task_ids()}

    def policy(messages, tools):
        request = next((m.content for m in messages if m.role == "user"), None)
        task_id = by_request.get(request)
        if task_id is None:
            return Message(role="assistant", content="Sorry, I cannot help with that.")
        steps = expert_steps(env, task_id)
        done = sum(1 for m in messages if m.role == "assistant")
        if done < len(steps):
            return steps[done]
        return Message(role="assistant", content="Is there anything else I can help with?")

    return policy
