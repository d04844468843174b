"""Store trajectories to mine and a noisy drafter, shared by the mining and training tests."""

from __future__ import annotations

import hashlib

from specagent.core.classify import classify_tools
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message, ToolCall, Trajectory
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy
from specagent.runtime.drafting import live_jobs

TASKS = ["lookup_01", "lookup_02", "single_write_01", "lookups_then_write_01", "policy_forbids_01", "multi_write_01"]


def expert_trajectories(tasks=TASKS) -> list[Trajectory]:
    """The store expert's run of each task, as `specagent collect` would record it."""
    env = StoreEnv()
    expert = ScriptedEngine(expert_policy(env), "expert")
    out = []
    for task in tasks:
        ep = run_episode(env, task, "strong", Models(strong=expert), ProtocolConfig(max_steps=16))
        out.append(Trajectory(f"store:{task}:0", task, env.tool_specs(), ep.messages, ep.reward, "test", "expert"))
    return out


def noisy_expert(env, every: int = 3):
    """The expert, except that a deterministic share of steps become a wrong lookup or reply."""
    policy = expert_policy(env)

    def drafter(messages, tools):
        h = int(hashlib.sha256(f"{len(messages)}{messages[1].content}".encode()).hexdigest(), 16)
        if h % every == 0:
            return Message(role="assistant", tool_calls=(ToolCall("x", "get_order_details", {"order_id": "W0000"}),))
        if h % every == 1 and h % 2:
            return Message(role="assistant", content="Your order is on its way.")
        return policy(messages, tools)

    return drafter


def store_jobs(settings):
    def jobs_for(traj, cuts):
        read_only = classify_tools(traj.tools)
        return live_jobs(StoreEnv, traj, cuts, settings.max_draft_steps, read_only)

    return jobs_for
