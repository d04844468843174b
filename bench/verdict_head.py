"""A trained verdict head on the validation split of its verdict dataset, served two ways:
the transformers engine (logits) and vLLM (`prompt_logprobs`). Same rows, same positions,
same threshold: AUROC, accuracy of the predicted accepted prefix, false-accept rate of
invalid steps, decoded tokens per verdict, and how far the two engines' P(valid) differ.

    python bench/verdict_head.py --head runs/store/export/verdict [--backends transformers vllm]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from specagent.core.interfaces import ScoreRequest
from specagent.engines.models import materialize
from specagent.engines.verdict_head import HeadSpec, boundary_positions, head_adapter_dir, probability
from specagent.records.segments import VerdictRow
from specagent.train.verdict_metrics import head_metrics


def build(backend: str, base: str, adapter: str, max_model_len: int):
    if backend == "vllm":
        from specagent.engines.vllm_engine import VLLMEngine

        return VLLMEngine(base, adapters={"head": adapter}, max_model_len=max_model_len,
                          engine_kwargs={"enforce_eager": True, "block_size": 32})
    from specagent.engines.transformers_engine import TransformersEngine

    return TransformersEngine(base, adapters={"head": adapter}, max_model_len=max_model_len)


def score_rows(engine, rows, spec: HeadSpec) -> tuple[list[list[float]], int, float]:
    """P(valid) per step per row; decoded tokens in all; seconds."""
    candidates = spec.token_ids(engine.tokenizer)
    requests = []
    for row in rows:
        verdict = VerdictRow.parse(row, "verdict row")
        ids, positions = boundary_positions(engine.tokenizer, verdict.chat(), verdict.tool_specs(),
                                            verdict.step_message_indices, spec.boundary)
        requests.append(ScoreRequest(ids, positions, candidates, "head"))
    began = time.perf_counter()
    results = engine.score(requests)
    seconds = time.perf_counter() - began
    scores = [[probability(y, n) for y, n in r.logprobs] for r in results]
    return scores, sum(r.usage.completion_tokens for r in results), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", required=True, help="export, training output or adapter dir")
    parser.add_argument("--dataset", help="verdict dataset (default: the one the head was trained on)")
    parser.add_argument("--backends", nargs="+", default=["transformers", "vllm"], choices=["transformers", "vllm"])
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--limit", type=int, help="the first N validation verify prompts (default: all)")
    parser.add_argument("--out", default="runs/bench/verdict_head.json")
    args = parser.parse_args()

    from datasets import load_from_disk

    adapter = head_adapter_dir(args.head)
    spec = HeadSpec.load(adapter)
    export = Path(args.head) / "export.json"
    config = Path(args.head) / "config.yaml"
    source = Path(json.loads(export.read_text())["source"]) if export.is_file() else Path(args.head)
    trained = yaml.safe_load((source / "config.yaml").read_text()) if (source / "config.yaml").is_file() else {}
    if not config.is_file() and not trained:
        raise SystemExit("cannot find the head's training config; pass --dataset")
    dataset = args.dataset or trained["dataset"]
    rows = [r for r in load_from_disk(dataset)["validation"]]
    rows = [r for r in rows if len(r["labels"])][: args.limit]
    base = materialize(spec.base_model or trained.get("model", "smollm2"), trained.get("gguf_file"))
    labels = [list(r["labels"]) for r in rows]

    results, scores_by = {}, {}
    for backend in args.backends:
        engine = build(backend, base, str(adapter), args.max_model_len)
        try:
            scores, decoded, seconds = score_rows(engine, rows, spec)
        finally:
            getattr(engine, "close", lambda: None)()
        scores_by[backend] = scores
        results[backend] = {**head_metrics(scores, labels, spec.threshold),
                            "decoded_tokens_per_verdict": decoded / len(rows), "seconds": round(seconds, 1)}
    if len(scores_by) == 2:
        a, b = scores_by.values()
        results["max_abs_p_difference"] = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    report = {"head": str(adapter), "dataset": dataset, "rows": len(rows), "steps": sum(map(len, labels)),
              "valid_steps": sum(map(sum, labels)), "threshold": spec.threshold, **results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))

    print(f"\nvalidation: {len(rows)} verify prompts, {report['steps']} steps ({report['valid_steps']} valid); "
          f"threshold {spec.threshold:.3f}")
    print(f"{'engine':<13} {'AUROC':>6} {'prefix acc':>10} {'false-accept':>12} {'false-reject':>12} "
          f"{'decoded/verdict':>15} {'seconds':>8}")
    for backend in args.backends:
        r = results[backend]
        fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{backend:<13} {fmt(r['auroc']):>6} {fmt(r['prefix_accuracy']):>10} {fmt(r['false_accept_rate']):>12} "
              f"{fmt(r['false_reject_rate']):>12} {r['decoded_tokens_per_verdict']:>15.1f} {r['seconds']:>8}")
    if "max_abs_p_difference" in results:
        print(f"max |P_transformers - P_vllm| over all steps: {results['max_abs_p_difference']:.3f}")


if __name__ == "__main__":
    main()
