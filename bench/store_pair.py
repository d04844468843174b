"""The store pair, measured in one run: is the drafter cheap, and does S accept what it drafts?

On S's own trajectories of the store's eval split (`specagent collect` with S), at the same
cut points, under the same DRAFT rules, live environment and `match` labeler (DESIGN §3):

- offline acceptance of the base weak model W (SmolLM2-135M-Instruct, full prompt) and of
  the tuned drafter (e.g. S's first k layers, tuned on S's trajectories; its own prompt
  profile), each on its own engine of the same backend;
- the weight bytes each engine loaded (`engine.cost`, from the weights, not a config);
- decode speed: tokens/s of the drafter and of S generating from the same prompts, one
  request at a time (as an episode drafts), on the same backend.

    python bench/store_pair.py --trajectories runs/store/strong/eval.jsonl \\
        --drafter runs/store/export/drafter/model --strong runs/store/export/strong/merged

Writes `--out` (JSON with the command's arguments and the git SHA).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specagent.config import EnvConfig, MineConfig, ProtocolSettings
from specagent.core.interfaces import ChatRequest
from specagent.records.trajectories import read_trajectories
from specagent.runtime.drafting import draft_settings, drafting_environment
from specagent.runtime.provenance import versions
from specagent.train.acceptance import HeldOut, offline_acceptance


def build_engine(backend: str, model: str, max_model_len: int):
    if backend == "vllm":
        from specagent.engines.vllm_engine import VLLMEngine

        return VLLMEngine(model, max_model_len=max_model_len, engine_kwargs={"enforce_eager": True, "block_size": 32})
    from specagent.engines.transformers_engine import TransformersEngine

    return TransformersEngine(model, max_model_len=max_model_len)


def held_out(args: argparse.Namespace) -> HeldOut:
    """S's trajectories at evenly spaced cut points, drafted in the live store restored to each."""
    trajectories = read_trajectories(args.trajectories)[: args.limit]
    mine = MineConfig(trajectories=args.trajectories, env=EnvConfig(name="store", split=args.split, user=args.user,
                                                                per_kind=args.per_kind),
                      protocol=ProtocolSettings(max_draft_steps=args.max_draft_steps, max_tokens=args.max_tokens,
                                                draft_stop_below=args.draft_stop_below),
                      max_cuts_per_trajectory=args.cuts)
    settings = draft_settings(mine, drafter_adapter=None)
    jobs_for, _ = drafting_environment(mine, trajectories, settings)
    return HeldOut(trajectories, jobs_for, settings, args.max_model_len)


def decode_speed(engine, data: HeldOut, requests: int, max_tokens: int) -> dict:
    """Tokens/s over `requests` single-request generations from the first cut points' contexts."""
    contexts = [t.messages[:cut] for t in data.trajectories for cut in (i for i, m in enumerate(t.messages)
                                                                          if m.role == "assistant")][:requests]
    tools = data.trajectories[0].tools
    engine.chat([ChatRequest(contexts[0], tools, 4)])  # warm-up
    tokens = seconds = 0.0
    for context in contexts:
        began = time.perf_counter()
        completion = engine.chat([ChatRequest(context, tools, max_tokens)])[0]
        seconds += time.perf_counter() - began
        tokens += completion.usage.completion_tokens
    return {"requests": len(contexts), "tokens": int(tokens), "seconds": round(seconds, 2),
            "tokens_per_s": tokens / seconds if seconds else None}


def measure(name: str, model: str, data: HeldOut, args: argparse.Namespace, acceptance: bool) -> dict:
    began = time.perf_counter()
    engine = build_engine(args.backend, model, args.max_model_len)
    try:
        out = {"model": model, "weight_bytes": engine.cost.weight_bytes,
               "kv_bytes_per_token": engine.cost.kv_bytes_per_token}
        if acceptance:
            out["acceptance"] = offline_acceptance(engine, data, progress=f"{name} drafts")
        if name != "base":
            out["decode"] = decode_speed(engine, data, args.speed_requests, args.speed_tokens)
    finally:
        engine.close()
    out["seconds"] = round(time.perf_counter() - began, 1)
    print(f"{name}: {json.dumps(out)}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", required=True, help="S's runs on the eval split (specagent collect)")
    parser.add_argument("--drafter", required=True, help="the tuned drafter: a model dir (an export's model/)")
    parser.add_argument("--strong", required=True, help="S: a model dir (an export's merged/)")
    parser.add_argument("--base", default="smollm2", help="the base weak model W")
    parser.add_argument("--split", default="eval")
    parser.add_argument("--user", choices=["ticket", "multi_turn"], default="ticket")
    parser.add_argument("--per-kind", type=int, default=None,
                        help="the split's generated tasks per kind, as the trajectories were collected (env.per_kind)")
    parser.add_argument("--limit", type=int, default=None, help="the first N trajectories")
    parser.add_argument("--cuts", type=int, default=None, help="evenly spaced cut points per trajectory (default all)")
    parser.add_argument("--max-draft-steps", type=int, default=4)
    parser.add_argument("--draft-stop-below", type=float, default=0.0,
                        help="the runtime's stop rule: a step is left unfinished (not counted as drafted) at its "
                             "first token below this probability (protocol.draft_stop_below; 0: never)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--backend", choices=["vllm", "transformers"], default="vllm")
    parser.add_argument("--speed-requests", type=int, default=16)
    parser.add_argument("--speed-tokens", type=int, default=64)
    parser.add_argument("--models", nargs="+", choices=["base", "tuned", "strong"], default=["base", "tuned", "strong"],
                        help="which to measure (the summary's ratios need tuned and strong; base: W's acceptance)")
    parser.add_argument("--out", default="runs/bench/store_pair.json")
    args = parser.parse_args()

    data = held_out(args)
    results = {name: measure(name, model, data, args, acceptance)
               for name, model, acceptance in (("base", args.base, True), ("tuned", args.drafter, True),
                                               ("strong", args.strong, False)) if name in args.models}
    summary = {f"{key}_{name}": results[name]["acceptance"][figure] for name in ("base", "tuned") if name in results
               for key, figure in (("acceptance", "acceptance_rate"), ("mean_accepted_prefix", "mean_accepted_prefix"))}
    if "tuned" in results and "strong" in results:
        tuned, strong = results["tuned"], results["strong"]
        summary["weight_bytes_ratio"] = tuned["weight_bytes"] / strong["weight_bytes"]
        summary["decode_speed_ratio"] = (tuned["decode"]["tokens_per_s"] / strong["decode"]["tokens_per_s"]
                                         if tuned["decode"]["tokens_per_s"] and strong["decode"]["tokens_per_s"] else None)
    report = {"command": " ".join(sys.argv), "git_sha": versions().get("git_sha"), "backend": args.backend,
              "trajectories": len(data.trajectories), "cuts": args.cuts, "max_draft_steps": args.max_draft_steps,
              "draft_stop_below": args.draft_stop_below, **results, "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))
    print(args.out)


if __name__ == "__main__":
    main()
