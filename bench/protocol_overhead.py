"""How much of an episode's wall time is the protocol itself (everything but model calls)?

Scripted models with realistic latency play both roles on the built-in store domain:
the strong model is the domain's expert, the weak drafter follows the expert but goes
wrong on a share of its steps, and a generative verifier (same scripted strong engine)
answers with the true valid-prefix length. Everything real runs: the environment, tool
execution with timeouts, verify-prompt construction, verdict parsing, commit, repair,
accounting. Prints overhead = (wall - time inside model calls) / wall. Target < 2%.

    python bench/protocol_overhead.py [--tasks 42] [--error-rate 0.3]
"""

from __future__ import annotations

import argparse
import hashlib
import time

from specagent.core.canonical import same_step
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message
from specagent.core.verify import parse_verdict
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy

# Latencies of a small drafter and a large verifier on one accelerator (seconds per token).
WEAK = dict(prefill_s_per_token=0.00002, decode_s_per_token=0.004)
STRONG = dict(prefill_s_per_token=0.0001, decode_s_per_token=0.02)


def noisy(policy, error_rate: float):
    """The expert, except that a deterministic share of its steps are wrong lookups."""

    def drafter(messages, tools):
        key = hashlib.sha256(str(len(messages)).encode() + (messages[1].content or "").encode()).digest()
        if key[0] / 255 < error_rate:
            return Message(role="assistant", content="I think your order was delivered yesterday.")
        return policy(messages, tools)

    return drafter


def strong_with_verdict(expert):
    """The expert; asked for a verdict, it answers the number of drafted steps it would take."""

    def strong(messages, tools):
        last = messages[-1]
        if last.role == "user" and (last.content or "").startswith("REVIEW."):
            k = parse_verdict(last.content.split("from 0 to ")[-1], 99) or 0
            drafted = [m for m in messages[:-1] if m.role == "assistant"][-k:]
            context_len = len(messages) - 1
            accepted = 0
            for step in drafted:
                upto = messages[: messages.index(step, 0, context_len)]
                if not same_step(step, expert(upto, tools)):
                    break
                accepted += 1
            return str(accepted)
        return expert(messages, tools)

    return strong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=42)
    parser.add_argument("--error-rate", type=float, default=0.3)
    args = parser.parse_args()

    env = StoreEnv()
    expert = expert_policy(env)
    strong = ScriptedEngine(strong_with_verdict(expert), "strong", **STRONG)
    weak = ScriptedEngine(noisy(expert, args.error_rate), "weak", **WEAK)
    from specagent.core.verify import GenerativeVerifier

    models = Models(strong=strong, weak=weak, verifier=GenerativeVerifier(strong))
    wall = model = 0.0
    rewards = []
    start = time.perf_counter()
    for task in env.task_ids()[: args.tasks]:
        ep = run_episode(env, task, "specagent", models, ProtocolConfig(max_steps=20))
        wall += ep.wall_seconds
        model += ep.ledger.total().seconds
        rewards.append(ep.reward)
    overhead = (wall - model) / wall
    print(f"episodes: {len(rewards)}  success: {sum(rewards) / len(rewards):.2f}  "
          f"wall: {wall:.2f}s  in model calls: {model:.2f}s  (total {time.perf_counter() - start:.2f}s)")
    print(f"protocol overhead (everything but model calls) / wall = {overhead:.4f} ({overhead:.2%}); target < 2%")


if __name__ == "__main__":
    main()
