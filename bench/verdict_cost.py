"""What a likelihood verdict costs on vLLM, and whether the repair reuses its prefill.

vLLM V1 computes `prompt_logprobs` without reading the prefix cache, so the verify prefill
of the likelihood verdict (`engines/verdict_likelihood.py`) recomputes every token. Two
questions decide whether that is acceptable (issue 16, part 2):

- **cost**: the verify request's time against a plain prefill of the same tokens (one
  generated token, no logprobs), both on a cold cache, same engine;
- **reuse**: after the verify request, the repair (the strong model continuing from the
  context plus the accepted steps) asks for its prompt; how many of its prompt tokens
  vLLM serves from the cache the verify request left.

The segments are the strong model's own next steps at one cut point of each of its
recorded runs (`reference_segment`: lookups with their recorded results, then the first
held step), so the verdict accepts most of them and the repair prompt is long. Order per
segment: cache reset, verify, repair (reuse), cache reset, plain prefill (cost).

    python bench/verdict_cost.py --trajectories runs/store/strong/eval.jsonl \\
        --strong runs/store/export/strong/merged --limit 24
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from specagent.core.classify import classify_tools
from specagent.core.interfaces import ChatRequest
from specagent.engines.verdict_likelihood import LikelihoodVerifier
from specagent.engines.vllm_engine import VLLMEngine
from specagent.records.trajectories import read_trajectories
from specagent.runtime.drafting import after_step, reference_segment
from specagent.runtime.provenance import versions


def cut_point(traj) -> int | None:
    """The run's middle assistant step."""
    cuts = [i for i, m in enumerate(traj.messages) if m.role == "assistant" and i > 0]
    return cuts[len(cuts) // 2] if cuts else None


def committed_end(traj, cut: int, accepted: int) -> int:
    """End of the committed context after `accepted` of the strong model's own steps at `cut`:
    each step with the tool results recorded after it (an approved write's real result, not
    the placeholder the verify prompt showed)."""
    i = cut
    for _ in range(accepted):
        i = after_step(traj.messages, i)
    return i


def timed(fn):
    began = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", required=True, help="the strong model's recorded runs (specagent collect)")
    parser.add_argument("--strong", required=True, help="the strong model: a model dir (an export's merged/)")
    parser.add_argument("--limit", type=int, default=24, help="runs, one segment each")
    parser.add_argument("--max-steps", type=int, default=4, help="steps per segment (DRAFT's max_draft_steps)")
    parser.add_argument("--threshold", type=float, default=1.0)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--warm-context", action="store_true",
                        help="prefill the context before verify and plain prefill (as in a run): both compute the tail")
    parser.add_argument("--out", default="runs/bench/verdict_cost.json")
    args = parser.parse_args()

    from vllm import SamplingParams

    engine = VLLMEngine(args.strong, max_model_len=args.max_model_len,
                        engine_kwargs={"enforce_eager": True, "block_size": 32})
    verifier = LikelihoodVerifier(engine, threshold=args.threshold)
    plain = SamplingParams(max_tokens=1, detokenize=False, temperature=0.0)
    rows = []
    try:
        trajectories = read_trajectories(args.trajectories)[: args.limit]
        first = trajectories[0]
        engine.chat([ChatRequest(first.messages[:2], first.tools, 2)])  # warm-up, both request kinds
        engine._generate([engine._prompt_ids(ChatRequest(first.messages[:2], first.tools, 1))],
                         [SamplingParams(max_tokens=1, detokenize=False, temperature=0.0, prompt_logprobs=0)], [None])
        for traj in tqdm(trajectories, desc="segments", unit="seg"):
            read_only = classify_tools(traj.tools, strict=False)
            cut = cut_point(traj)
            if cut is None:
                continue
            segment = reference_segment(traj, cut, read_only, args.max_steps)
            steps = segment.verifiable
            if not steps:
                continue
            context = traj.messages[:cut]
            context_ids = engine._prompt_ids(ChatRequest(context, traj.tools, 1))

            def reset() -> None:
                engine.llm.reset_prefix_cache()
                if args.warm_context:
                    engine._generate([context_ids], [plain], [None])

            reset()
            (verdict, charges), verify_s = timed(lambda: verifier.verify(context, traj.tools, segment))
            usage = charges[0][1]
            committed = traj.messages[: committed_end(traj, cut, verdict.accepted)]
            repair = engine.chat([ChatRequest(committed, traj.tools, 1)])[0]
            prompt_ids, _ = verifier.prompt(context, traj.tools, steps)  # what the verify request sent
            reset()
            plain_out, plain_s = timed(lambda: engine._generate([prompt_ids], [plain], [None]))
            rows.append({"trajectory": traj.id, "cut": cut, "steps": len(steps), "accepted": verdict.accepted,
                         "verify_prompt_tokens": usage.prompt_tokens, "verify_cached_tokens": usage.cached_tokens,
                         "plain_cached_tokens": plain_out[0].num_cached_tokens or 0,
                         "verify_s": round(verify_s, 4), "plain_prefill_s": round(plain_s, 4),
                         "repair_prompt_tokens": repair.usage.prompt_tokens,
                         "repair_cached_tokens": repair.usage.cached_tokens})
    finally:
        engine.close()

    repair_prompt = sum(r["repair_prompt_tokens"] for r in rows)
    repair_cached = sum(r["repair_cached_tokens"] for r in rows)
    ratios = [r["verify_s"] / r["plain_prefill_s"] for r in rows if r["plain_prefill_s"]]
    summary = {
        "segments": len(rows),
        "steps": sum(r["steps"] for r in rows),
        "accepted_steps": sum(r["accepted"] for r in rows),
        "verify_prompt_tokens": sum(r["verify_prompt_tokens"] for r in rows),
        "verify_s_total": round(sum(r["verify_s"] for r in rows), 3),
        "plain_prefill_s_total": round(sum(r["plain_prefill_s"] for r in rows), 3),
        "verify_vs_plain_total": (sum(r["verify_s"] for r in rows) / sum(r["plain_prefill_s"] for r in rows)
                                  if rows else None),
        "verify_vs_plain_median": statistics.median(ratios) if ratios else None,
        "repair_prompt_tokens": repair_prompt,
        "repair_cached_tokens": repair_cached,
        "repair_cached_share": repair_cached / repair_prompt if repair_prompt else None,
    }
    report = {"command": " ".join(sys.argv), "git_sha": versions().get("git_sha"), "backend": "vllm",
              "warm_context": args.warm_context, "strong": args.strong, "threshold": args.threshold, "rows": rows, "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))
    print(args.out)


if __name__ == "__main__":
    main()
