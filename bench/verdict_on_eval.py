"""What a verdict let through in an eval, measured after the fact on the eval's own episodes.

For every episode of the chosen SpecAgent arms (`specagent eval`'s episodes.jsonl):

- each drafted step the verdict accepted (committed from the drafter) is compared with the step
  S writes greedily at the same context (one batched call to S): it was invalid when the two
  differ (`same_step`: other canonical calls, or another reply);
- each drafted step it rejected is compared with the step S committed in its place (the
  repair): it was valid when the two are the same (the rejection was a false reject).

Per arm: judged steps, invalid ones, false accepts, the false-accept rate (false accepts /
invalid steps: what a head's calibration targets), the false-reject rate, and the episodes that
ended by `max_steps`. Steps after a segment's first rejection are never judged, so they are not
counted. With a greedy S and the likelihood verdict at 1.0, false accepts are S's own
non-determinism (batching, bf16) and should be ~0.

    python bench/verdict_on_eval.py --episodes runs/quickstart/eval-64-head/episodes.jsonl \\
        --strong runs/quickstart/export/strong/merged --arms specagent specagent-head

Writes `--out` (JSON with the command and the git SHA).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from specagent.core.canonical import normalise_text, same_step
from specagent.core.types import Message, StepStatus, ToolSpec

COMMITTED_FROM_DRAFT = (StepStatus.ACCEPTED.value, StepStatus.HELD_APPROVED.value)
NOT_COMMITTED = (StepStatus.REJECTED.value, StepStatus.MALFORMED.value)


def judged_steps(episode: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdict's decisions in one episode: per judged drafted step, accepted or not, the
    context it was judged in (accepted ones), its text and the text committed in its place
    (rejected ones). Committed steps are the episode's assistant messages, in order."""
    assistant = [i for i, m in enumerate(episode["messages"]) if m["role"] == "assistant"]
    out, committed, pending = [], 0, None
    for step in episode["steps"]:
        status = step["status"]
        if status in NOT_COMMITTED:
            if status == StepStatus.REJECTED.value and step["source"] == "weak" and pending is None:
                pending = {"accepted": False, "text": step["text"]}  # the first rejection of its round
            continue
        if pending is not None:  # the step committed after a rejection: its repair
            pending["replacement"] = step["text"]
            out.append(pending)
            pending = None
        if status in COMMITTED_FROM_DRAFT and step["source"] == "weak" and committed < len(assistant):
            index = assistant[committed]
            out.append({"accepted": True, "context": episode["messages"][:index],
                        "message": episode["messages"][index]})
        committed += 1
    return out


def same_text(a: str, b: str) -> bool:
    return normalise_text(a) == normalise_text(b)


def tally(episodes: Sequence[dict[str, Any]], strong_step: Callable[[list[list[dict]]], list[Message]]
          ) -> dict[str, Any]:
    """The figures of one arm; ``strong_step`` maps contexts (OpenAI messages) to S's greedy steps."""
    decisions = [d for ep in episodes for d in judged_steps(ep)]
    accepted = [d for d in decisions if d["accepted"]]
    rejected = [d for d in decisions if not d["accepted"] and "replacement" in d]
    own = strong_step([d["context"] for d in accepted]) if accepted else []
    false_accepts = sum(not same_step(Message.from_openai(d["message"]), s) for d, s in zip(accepted, own))
    false_rejects = sum(same_text(d["text"], d["replacement"]) for d in rejected)
    invalid = false_accepts + len(rejected) - false_rejects
    valid = len(accepted) - false_accepts + false_rejects
    return {"episodes": len(episodes), "judged_steps": len(accepted) + len(rejected), "accepted": len(accepted),
            "rejected": len(rejected), "invalid": invalid, "false_accepts": false_accepts,
            "false_accept_rate": false_accepts / invalid if invalid else None,
            "false_rejects": false_rejects, "false_reject_rate": false_rejects / valid if valid else None,
            "max_steps_episodes": sum(ep["stop_reason"] == "max_steps" for ep in episodes),
            "success": sum(ep["reward"] for ep in episodes) / len(episodes) if episodes else None}


def vllm_strong(model: str, tools: Sequence[ToolSpec], max_tokens: int, max_model_len: int):
    from specagent.core.interfaces import ChatRequest
    from specagent.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(model, max_model_len=max_model_len, engine_kwargs={"enforce_eager": True, "block_size": 32})

    def step(contexts: list[list[dict]]) -> list[Message]:
        requests = [ChatRequest([Message.from_openai(m) for m in c], list(tools), max_tokens) for c in contexts]
        return [c.message for c in engine.chat(requests)]

    return engine, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", required=True, help="an eval's episodes.jsonl")
    parser.add_argument("--strong", required=True, help="S: a model dir (an export's merged/)")
    parser.add_argument("--arms", nargs="+", required=True, help="the SpecAgent arms (run names, e.g. head@0.3)")
    parser.add_argument("--env-split", default="eval", help="the store split the eval ran (its tools)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--out", default="runs/bench/verdict_on_eval.json")
    args = parser.parse_args()

    from specagent.envs.store import StoreEnv
    from specagent.runtime.episodes import read_episodes
    from specagent.runtime.provenance import versions

    episodes = read_episodes(args.episodes)
    tools = StoreEnv(split=args.env_split).tool_specs()
    engine, step = vllm_strong(args.strong, tools, args.max_tokens, args.max_model_len)
    try:
        arms = {arm: tally([ep for ep in episodes if ep["arm"] == arm], step) for arm in args.arms}
    finally:
        engine.close()
    report = {"command": " ".join(sys.argv), "git_sha": versions().get("git_sha"), "arms": arms}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(arms, indent=2))
    print(args.out)


if __name__ == "__main__":
    main()
