"""Drafter offline acceptance before vs after LoRA training, on a mine run's validation split.

The base weak model and the trained adapter draft at the same held-out cut points (the
mine run's validation trajectories, its environment, its DRAFT rules) and are labeled by
the same `match` labeler with the metric definitions of DESIGN §3 (`segment_stats`):
acceptance = accepted drafted steps / drafted steps. One engine serves both (the adapter
by LoRA per request), so nothing differs but the weights. With ``--merged`` the tuned
drafter is the merged checkpoint of an export (`specagent export --merge`), served on an
engine of its own with the same settings, no LoRA path.

    python bench/drafter_acceptance.py --mined runs/airline/mined-all --limit 5 \
        --adapter runs/airline/train/drafter-smollm2 [--cuts 6|all] [--backend vllm]
    python bench/drafter_acceptance.py --mined runs/airline/mined-live-all --cuts 4 \
        --merged runs/airline/export/drafter-whole-runs/merged [--drafters tuned] [--segments PREFIX]

Acceptance comes with a 95% bootstrap interval over the validation runs (runs resampled
with replacement, Σaccepted / Σdrafted each time) and a breakdown by position in the
drafted segment and by tool.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from specagent.config import AcceptanceSettings, MineConfig, load_config
from specagent.runtime.assembly import adapter_dir
from specagent.train.acceptance import held_out, offline_acceptance


def build_engine(backend: str, mine: MineConfig, adapter: str | None, model: str | None = None):
    """The drafter's engine as the mine run configured it (LoRA ``adapter`` as "tuned"), or, with
    ``model``, that checkpoint's own engine of the same kind and settings, no adapter."""
    name, gguf = (model, None) if model else (mine.drafter.model, mine.drafter.gguf_file)
    adapters = {"tuned": adapter} if adapter else {}
    if backend == "vllm":
        from specagent.engines.vllm_engine import VLLMEngine

        return VLLMEngine(name, gguf_file=gguf, adapters=adapters, max_model_len=mine.drafter.max_model_len,
                          engine_kwargs=dict(mine.drafter.engine_kwargs))
    from specagent.engines.transformers_engine import TransformersEngine

    return TransformersEngine(name, gguf_file=gguf, adapters=adapters, max_model_len=mine.drafter.max_model_len)


def cuts_arg(value: str) -> int | None:
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a positive number of cut points, or `all`")
    return int(value)


def pct(rate: float | None) -> str:
    return "–" if rate is None else f"{100 * rate:.1f}%"


def breakdown(results: dict, key: str, title: str) -> None:
    print(f"\nby {title}: drafted / accepted / rate per drafter")
    names = list(results)
    rows = sorted({k for r in results.values() for k in r[key]}, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else k))
    print(f"{'':<30}" + "".join(f"{name:>24}" for name in names))
    for row in rows:
        cells = []
        for name in names:
            c = results[name][key].get(row)
            cells.append("–" if c is None else f"{c['drafted']} / {c['accepted']} / {pct(c['rate'])}")
        print(f"{row:<30}" + "".join(f"{cell:>24}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mined", default="runs/airline/mined-all", help="a `specagent mine` output dir")
    parser.add_argument("--adapter", default="runs/airline/train/drafter-smollm2",
                        help="the trained drafter (training output, export, or adapter dir)")
    parser.add_argument("--cuts", type=cuts_arg, default=6,
                        help="cut points per validation trajectory, evenly spaced; `all`: every assistant step")
    parser.add_argument("--limit", type=int, default=None, help="validation trajectories (default: all)")
    parser.add_argument("--backend", choices=["vllm", "transformers"], default="vllm")
    parser.add_argument("--merged", default=None,
                        help="the tuned drafter as one checkpoint instead (`specagent export --merge`'s merged/): "
                             "served on its own engine with the same settings, no LoRA path")
    parser.add_argument("--drafters", nargs="+", choices=["base", "tuned"], default=["base", "tuned"],
                        help="which drafters draft (default both, in one run)")
    parser.add_argument("--stop-repeats", action="store_true",
                        help="draft with protocol.draft_stop_repeats (a lookup repeated since the last user turn "
                             "or write ends the draft; counted as a drafted step that is not accepted)")
    parser.add_argument("--out", default="runs/bench/drafter_acceptance.json")
    parser.add_argument("--segments", default=None,
                        help="also write every labeled drafted segment, per drafter, to <SEGMENTS>.<base|tuned>.jsonl")
    args = parser.parse_args()

    adapter = None if args.merged else adapter_dir(args.adapter)
    if adapter is None and not args.merged:
        raise SystemExit(f"{args.adapter}: no adapter there (train one with `specagent train drafter`)")
    mine = load_config(MineConfig, Path(args.mined) / "mine_config.yaml")
    data = held_out(AcceptanceSettings(mined=args.mined, limit=args.limit, max_cuts_per_trajectory=args.cuts))
    if args.stop_repeats:  # the runtime's repeat rule; each repeat counts as a drafted step, not accepted
        data = dataclasses.replace(data, settings=dataclasses.replace(data.settings, draft_stop_repeats=True))
    results, shared = {}, None
    try:
        for name in ("base", "tuned"):
            if name not in args.drafters:
                continue
            began = time.perf_counter()
            if args.merged:  # each drafter its own engine, one at a time
                engine, lora = build_engine(args.backend, mine, None, args.merged if name == "tuned" else None), None
            else:  # one engine for both, the adapter by LoRA per request: nothing differs but the weights
                shared = engine = shared or build_engine(args.backend, mine, adapter)
                lora = "tuned" if name == "tuned" else None
            run = dataclasses.replace(data, settings=dataclasses.replace(data.settings, drafter_adapter=lora))
            kept: list[dict] = []
            try:
                figures = offline_acceptance(engine, run, progress=f"{name} drafts", keep=kept)
            finally:
                if engine is not shared:
                    getattr(engine, "close", lambda: None)()
            results[name] = {**figures, "seconds": round(time.perf_counter() - began, 1)}
            if args.segments:
                path = Path(f"{args.segments}.{name}.jsonl")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(seg) + "\n" for seg in kept))
    finally:
        if shared is not None:
            getattr(shared, "close", lambda: None)()
    report = {"mined": args.mined, "adapter": adapter, "merged": args.merged, "backend": args.backend, "cuts": args.cuts,
              "validation_trajectories": [t.id for t in data.trajectories], **results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))

    cuts = "every cut point" if args.cuts is None else f"{args.cuts} cut points each"
    print(f"\nvalidation: {len(data.trajectories)} trajectories, {cuts}, labeler match")
    print(f"{'drafter':<8} {'segments':>8} {'drafted':>8} {'accepted':>8} {'acceptance':>10} {'95% CI (runs)':>16} "
          f"{'mean prefix':>11}  ended by")
    for name, r in results.items():
        ci = r["acceptance_ci95"]
        interval = "–" if ci is None else f"[{pct(ci[0])}, {pct(ci[1])}]"
        prefix = "–" if r["mean_accepted_prefix"] is None else f"{r['mean_accepted_prefix']:.2f}"
        print(f"{name:<8} {r['segments']:>8} {r['drafted_steps']:>8} {r['accepted_steps']:>8} "
              f"{pct(r['acceptance_rate']):>10} {interval:>16} {prefix:>11}  {r['ended_by']}")
    breakdown(results, "by_position", "position in the drafted segment")
    breakdown(results, "by_tool", "tool (or step kind)")
    if len(results) == 2:
        base, tuned = results["base"]["acceptance_rate"] or 0.0, results["tuned"]["acceptance_rate"] or 0.0
        print(f"gain: {100 * (tuned - base):+.1f} points   ({args.out})")


if __name__ == "__main__":
    main()
