"""bench/verdict_on_eval.py: a verdict's false accepts and rejects, counted after the fact on
real episode records of a scripted run where the truth is known by construction."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.engines.scripted import ScriptedEngine, ScriptedVerifier
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy
from specagent.records.episodes import EpisodeRecord
from tests.helpers.mining import noisy_expert

spec = importlib.util.spec_from_file_location("verdict_on_eval", Path(__file__).parents[1] / "bench" / "verdict_on_eval.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

TASKS = ["lookup_01", "lookup_02", "single_write_01", "lookups_then_write_01", "multi_write_01", "lookup_03"]
NOISE = ("get_order_details({'order_id': 'W0000'})", "Your order is on its way.")


def test_false_accepts_and_rejects_are_what_the_scripted_run_made_them():
    """The drafter is the expert except for two fixed wrong steps the expert never takes; the
    verdict accepts the first drafted step of every segment, whatever it is, and nothing after.
    So a false accept is an accepted noise step, a false reject a rejected expert step."""
    env = StoreEnv()
    policy = expert_policy(env)
    models = Models(strong=ScriptedEngine(policy, "strong"), weak=ScriptedEngine(noisy_expert(env), "weak"),
                    verifier=ScriptedVerifier(lambda context, steps: min(1, len(steps))))
    episodes = [EpisodeRecord.of(run_episode(env, task, "specagent", models, ProtocolConfig(max_draft_steps=3,
                                                                                            max_steps=12)), 0, {})
                .model_dump(mode="json") for task in TASKS]

    accepted = [s for ep in episodes for s in ep["steps"] if s["status"] in bench.COMMITTED_FROM_DRAFT]
    first_rejected = []
    for ep in episodes:
        seen = set()
        for s in ep["steps"]:
            if s["status"] == "rejected" and s["round"] not in seen:
                seen.add(s["round"])
                first_rejected.append(s)
    expected_false_accepts = sum(s["text"] in NOISE for s in accepted)
    expected_false_rejects = sum(s["text"] not in NOISE for s in first_rejected)
    assert expected_false_accepts > 0 and expected_false_rejects > 0  # the run exercises both

    def expert_steps(contexts):
        from specagent.core.types import Message

        tools = env.tool_specs()
        return [policy([Message.from_openai(m) for m in c], tools) for c in contexts]

    figures = bench.tally(episodes, expert_steps)
    assert figures["accepted"] == len(accepted) and figures["rejected"] == len(first_rejected)
    assert figures["false_accepts"] == expected_false_accepts
    assert figures["false_rejects"] == expected_false_rejects
    assert figures["invalid"] == expected_false_accepts + len(first_rejected) - expected_false_rejects
    assert figures["false_accept_rate"] == expected_false_accepts / figures["invalid"]
