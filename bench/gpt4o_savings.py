"""What SpecAgent would have saved GPT-4o on its recorded airline runs: an offline simulation.

GPT-4o's recorded held-out runs (tasks 20-24 of the shared tau-bench file) play the strong
model: its repair at a point of the walk is its recorded next step, and what it decodes is
that step's tokens. The drafter drafts against the live airline environment restored to that
point (the run's writes replayed, as `specagent mine` does), and a verdict accepts a prefix:
a trained head (`--head`: a LoRA verdict head or a likelihood head, on the strong engine)
and always the oracle (the `match` labeler against the recorded continuation), so that
drafter quality and verifier quality can be told apart. Each run is followed to its end or
to its first false accept (an approved step `match` rejects). The walk and its accounting: `specagent/eval/savings.py`.

GPT-4o's tokenizer is not available: tokens are counted with the drafter's tokenizer, on each
step's text plus its tool calls as JSON ({"name": ..., "arguments": ...}).

    python bench/gpt4o_savings.py --adapter runs/airline/train/drafter-smollm2 \\
        [--head runs/airline/export/verdict] [--trials 0 1] [--limit 1] [--backend vllm]
    python bench/gpt4o_savings.py --drafter runs/airline/export/drafter-whole-runs/merged \\
        --head runs/airline/train/verdict-likelihood --verdicts head \\
        --head-backend transformers --head-dtype bfloat16 --kv-cache-gib 6

`--verdicts` picks the walks (default: oracle, and head with `--head`); `--head-backend
transformers` scores a likelihood head with logits at the drafted tokens only, where vLLM's
`prompt_logprobs` computes every prompt position.

Writes `--out` (JSON: per-run rows and totals per verdict, the command, the git SHA).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from specagent.config import AirlineEnvSettings, EnvConfig
from specagent.core.classify import classify_tools
from specagent.core.draft import DraftJob, draft_batch
from specagent.core.types import Message, Segment, ToolCall, Trajectory
from specagent.eval.savings import RunSavings, simulate, totals
from specagent.runtime.assembly import adapter_dir, build_env
from specagent.runtime.drafting import restore
from specagent.runtime.provenance import versions

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT.parent / "shared" / "data" / "tau-bench-airline" / "gpt-4o-trajectories-tasks-00-24.json"
DRAFTER, HEAD = "tuned", "head"  # adapter names on the engines


def held_out_runs(path: str, tools: str, tasks: Sequence[str], trials: Sequence[int] | None,
                  limit: int | None) -> list[Trajectory]:
    """GPT-4o's runs of ``tasks`` (ids `<file>:<task>:<trial>`), imported as `specagent import` does."""
    from specagent.data.importers import convert_files

    runs, _ = convert_files([path], tools_yaml=tools, model="gpt-4o")
    picked = [r for r in runs if r.task_id in tasks and (trials is None or int(r.id.rsplit(":", 1)[1]) in trials)]
    return picked[:limit]


def build_engine(backend: str, model: str, gguf_file: str | None, adapters: dict[str, str], max_model_len: int,
                 kv_cache_gib: float | None = None, dtype: str = "float32"):
    if backend == "vllm":
        from specagent.engines.vllm_engine import VLLMEngine

        kwargs: dict[str, Any] = {"enforce_eager": True, "block_size": 32}
        if kv_cache_gib:  # room for every run's context at once, so each round's prefill hits the prefix cache
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        return VLLMEngine(model, gguf_file=gguf_file, adapters=adapters, max_model_len=max_model_len,
                          engine_kwargs=kwargs)
    from specagent.engines.transformers_engine import TransformersEngine

    return TransformersEngine(model, gguf_file=gguf_file, adapters=adapters, max_model_len=max_model_len, dtype=dtype)


def token_counter(tokenizer: Any) -> Callable[[Message], int]:
    def count(message: Message) -> int:
        calls = "".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in message.tool_calls)
        return len(tokenizer((message.content or "") + calls, add_special_tokens=False)["input_ids"])
    return count


def live_drafter(engine: Any, env: EnvConfig, args: argparse.Namespace, adapter: str | None):
    """Drafts every request of a round in one engine batch, each in a fresh airline env
    restored to its cut point; drafted lookups run for real."""
    def make_env():
        return build_env(env)

    rounds = [0]

    def draft(requests: Sequence[tuple[Trajectory, int, list[Message]]]) -> list[Segment]:
        began, jobs = time.perf_counter(), []
        for run, cut, context in requests:
            live = restore(make_env, run, cut, read_only(run))

            def execute(call: ToolCall, live=live) -> Message:
                return Message(role="tool", content=live.execute(call), tool_call_id=call.id, name=call.name)

            jobs.append(DraftJob(context, execute, args.max_draft_steps))
        first = requests[0][0]  # the imported runs share one tool list
        segments = draft_batch(engine, jobs, first.tools, read_only(first), args.max_tokens, adapter,
                               stop_repeats=args.stop_repeats)
        rounds[0] += 1
        print(f"round {rounds[0]}: {len(requests)} runs drafted, {sum(len(s.steps) for s in segments)} steps, "
              f"{time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
        return segments
    return draft


def read_only(run: Trajectory) -> dict[str, bool]:
    return classify_tools(run.tools, (), (), strict=False)


def print_table(name: str, results: Sequence[RunSavings], summary: dict[str, Any]) -> None:
    print(f"\nverdict: {name}")
    print(f"{'run':<8} {'steps':>5} {'tokens':>6} {'supplied':>8} {'repaired':>8} {'skipped':>7} {'unreached':>9} "
          f"{'share':>6} {'rounds':>6} {'passes':>6} {'FA':>3} {'end':>4}")
    for r in results:
        share = "–" if r.supplied_share is None else f"{100 * r.supplied_share:.1f}%"
        print(f"{r.run_id.split(':', 1)[1]:<8} {r.steps:>5} {r.tokens:>6} {r.supplied_tokens:>8} "
              f"{r.repaired_tokens:>8} {r.skipped_tokens:>7} {r.unreached_tokens:>9} {share:>6} {r.rounds:>6} "
              f"{r.verify_passes:>6} {r.false_accepts:>3} {'yes' if r.followed_to_end else 'no':>4}")
    share, ci = summary["supplied_share"], summary["supplied_share_ci95"]
    shown = "–" if share is None else f"{100 * share:.1f}%" + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")
    print(f"total: {summary['supplied_tokens']}/{summary['tokens']} tokens supplied ({shown}); per run: "
          f"{summary['rounds_per_run']:.2f} rounds, {summary['verify_passes_per_run']:.2f} verify passes, "
          f"{summary['false_accepts_per_run']:.2f} false accepts; {summary['followed_to_end']}/{summary['runs']} "
          "followed to the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=str(RUNS), help="the tau-bench results file (GPT-4o's runs)")
    parser.add_argument("--tools", default=str(ROOT / "configs" / "import" / "tau_airline_tools.yaml"))
    parser.add_argument("--data-dir", default=None, help="the airline database (default: the runs file's dir)")
    parser.add_argument("--tasks", nargs="+", default=["20", "21", "22", "23", "24"], help="held-out task ids")
    parser.add_argument("--trials", nargs="+", type=int, default=None, help="trials to keep (default all)")
    parser.add_argument("--limit", type=int, default=None, help="the first N runs")
    parser.add_argument("--drafter", default="smollm2", help="the drafter's model (hub id, dir, or smollm2)")
    parser.add_argument("--gguf-file", default=None)
    parser.add_argument("--adapter", default=None, help="the tuned drafter (training output, export, adapter dir)")
    parser.add_argument("--head", default=None,
                        help="a verdict head: `specagent train verdict` kind head (its output or export) or kind "
                             "likelihood (its output dir)")
    parser.add_argument("--verdicts", nargs="+", choices=["oracle", "head"], default=None,
                        help="which walks to run (default: oracle, and head with --head)")
    parser.add_argument("--strong", default=None, help="the head's base model (default: its verdict.json base_model)")
    parser.add_argument("--threshold", type=float, default=None, help="the head's threshold (default: calibrated)")
    parser.add_argument("--backend", choices=["vllm", "transformers"], default="vllm")
    parser.add_argument("--head-backend", choices=["vllm", "transformers"], default=None,
                        help="the head's engine (default: --backend). A likelihood head scored on transformers "
                             "(logits at the drafted tokens only) skips vLLM's prompt_logprobs over every position")
    parser.add_argument("--head-dtype", default="float32", help="the head's transformers engine dtype (as trained)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--kv-cache-gib", type=float, default=None,
                        help="vLLM's KV cache (default: the engine's CPU default); every run's context side by side "
                             "wants ~23 KB a token for SmolLM2 in bf16")
    parser.add_argument("--max-draft-steps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=192, help="per drafted step")
    parser.add_argument("--window", type=int, default=4, help="the match labeler's window")
    parser.add_argument("--stop-repeats", action="store_true",
                        help="draft with protocol.draft_stop_repeats: a lookup repeated since the last user turn or "
                             "write ends the draft, and GPT-4o writes that step")
    parser.add_argument("--out", default="runs/bench/gpt4o_savings.json")
    args = parser.parse_args()

    walks = args.verdicts or ["oracle", *(["head"] if args.head else [])]
    if "head" in walks and not args.head:
        raise SystemExit("--verdicts head needs --head")
    runs = held_out_runs(args.runs, args.tools, args.tasks, args.trials, args.limit)
    if not runs:
        raise SystemExit(f"{args.runs}: no runs of tasks {args.tasks} (trials {args.trials})")
    env = EnvConfig(name="airline", airline=AirlineEnvSettings(data_dir=args.data_dir or str(Path(args.runs).parent),
                                                               runs=args.runs))
    drafter_lora = adapter_dir(args.adapter) if args.adapter else None
    if args.adapter and drafter_lora is None:
        raise SystemExit(f"{args.adapter}: no adapter there (train one with `specagent train drafter`)")
    engines, verifier = open_engines(args, drafter_lora, with_head="head" in walks)
    drafter = engines[0]
    count = token_counter(drafter.tokenizer)
    draft = live_drafter(drafter, env, args, DRAFTER if drafter_lora else None)
    report: dict[str, Any] = {
        "command": " ".join(sys.argv), "git_sha": versions().get("git_sha"), "backend": args.backend,
        "head_backend": args.head_backend or args.backend,
        "drafter": args.drafter, "adapter": drafter_lora, "head": args.head, "runs": [r.id for r in runs],
        "tokenizer": f"the drafter's ({args.drafter}); GPT-4o's own is not available",
        "settings": {"max_draft_steps": args.max_draft_steps, "max_tokens": args.max_tokens, "window": args.window},
    }
    try:
        verdicts = {"oracle": None, "head": verifier}
        for name in walks:
            verify = verdicts[name]
            began = time.perf_counter()
            results = simulate(runs, draft, verify, count, read_only, args.window)
            summary = totals(results)
            report[name] = {"totals": summary, "per_run": [r.to_json() for r in results],
                            "seconds": round(time.perf_counter() - began, 1)}
            print_table(name, results, summary)
    finally:
        for engine in engines:
            getattr(engine, "close", lambda: None)()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(args.out)


def open_engines(args: argparse.Namespace, drafter_lora: str | None, with_head: bool = True) -> tuple[list[Any], Any]:
    """The drafter's engine, and with ``--head`` (when its walk runs) the head's verifier on the
    strong engine (the drafter's engine when both are the same model: one engine, two adapters). A head is either
    a LoRA verdict head (`kind: head`) or a likelihood head (`kind: likelihood`: the strong
    model's base weights score the drafted tokens, a logistic model reads them)."""
    drafter_adapters = {DRAFTER: drafter_lora} if drafter_lora else {}
    if not (with_head and args.head):
        return [build_engine(args.backend, args.drafter, args.gguf_file, drafter_adapters, args.max_model_len,
                             args.kv_cache_gib)], None
    likelihood = likelihood_head(args.head, args.threshold)
    if likelihood is not None:
        calibrated_on, head_dir, base = likelihood.calibration_tasks, None, likelihood.base_model
    else:
        from specagent.engines.verdict_head import HeadSpec, head_adapter_dir

        head_dir = head_adapter_dir(args.head)
        spec = HeadSpec.load(head_dir)
        calibrated_on, base = spec.calibration_tasks, spec.base_model
    if set(calibrated_on) & set(args.tasks):  # a threshold chosen on the answers it is measured on
        raise SystemExit(f"{args.head}: its threshold was calibrated on tasks "
                         f"{sorted(set(calibrated_on) & set(args.tasks))}; measure it on other tasks")
    strong = args.strong or base
    if not strong:
        raise SystemExit(f"{args.head}: the head names no base model; pass --strong")
    head_adapters = {HEAD: str(head_dir)} if head_dir else {}
    head_backend = args.head_backend or args.backend
    if strong == args.drafter and head_backend == args.backend:
        engine = build_engine(args.backend, strong, args.gguf_file, {**drafter_adapters, **head_adapters},
                              args.max_model_len, args.kv_cache_gib)
        engines = [engine]
    else:
        drafter = build_engine(args.backend, args.drafter, args.gguf_file, drafter_adapters, args.max_model_len,
                               args.kv_cache_gib)
        engine = build_engine(head_backend, strong, None, head_adapters, args.max_model_len, args.kv_cache_gib,
                              args.head_dtype)
        engines = [drafter, engine]
    if likelihood is not None:
        from specagent.engines.verdict_likelihood import LikelihoodVerifier

        verifier: Any = LikelihoodVerifier(engine, args.threshold, continue_repairs=False, head=likelihood)
    else:
        from specagent.engines.verdict_head import HeadVerifier

        verifier = HeadVerifier(engine, head_dir, args.threshold, adapter=HEAD)

    def verify(run: Trajectory, context: list[Message], segment: Segment) -> int:
        verdict, _ = verifier.verify(context, run.tools, segment)
        return verdict.accepted
    return engines, verify


def likelihood_head(path: str, threshold: float | None = None) -> Any:
    """The likelihood head at ``path`` (its file, or a `specagent train verdict` dir holding it),
    refused if degenerate at its calibrated threshold (``threshold`` None); None where there is
    none (a LoRA head)."""
    from specagent.engines.likelihood_head import LikelihoodHead
    from specagent.runtime.assembly import check_likelihood_head

    if LikelihoodHead.find(path) is None:
        return None
    head = LikelihoodHead.load(path)
    if threshold is None:
        check_likelihood_head(head, Path(path))
    return head


if __name__ == "__main__":
    main()
