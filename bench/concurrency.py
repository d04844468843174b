"""Throughput of concurrent episodes: the same N tasks in `specagent` mode at concurrency
1, 4 and 16, each engine behind a BatchingEngine, so drafts, verdicts and repairs of
different episodes share engine calls.

    python bench/concurrency.py [key.sub=value ...] [--config configs/run/store_smollm2_vllm.yaml]
                                [--tasks 16] [--levels 1 4 16] [--scripted-latency 0.05]

(overrides first: `--levels` takes every number after it)

Each level starts fresh engines (a prefix cache warmed by the level before would flatter
the next one) and prints a row: episodes/min, mean engine batch size (requests per engine
call over the distinct engines), acceptance, strong decode tokens, and wall per episode
(the latency one episode sees). Scripted engines (configs/run/store_scripted.yaml) get a
fixed latency per call, whatever its batch size, as a memory-bound forward pass costs.
Writes runs/bench/concurrency.json, and each level's episodes under runs/bench/concurrency/.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from specagent.config import RunConfig, load_config
from specagent.core.metrics import summarize
from specagent.engines import EnginePool
from specagent.engines.scripted import ScriptedEngine
from specagent.runtime.assembly import build_env, build_models, protocol_config, select_tasks
from specagent.runtime.episodes import run_tasks
from specagent.runtime.run import throughput

OUT = Path("runs/bench")
COLUMNS = ("concurrency", "episodes/min", "mean engine batch", "acceptance", "strong decode tokens",
           "wall per episode s")


def run_level(cfg: RunConfig, concurrency: int, scripted_latency: float) -> dict[str, Any]:
    """The config's tasks at one concurrency, on fresh engines; one row of the table."""
    env = build_env(cfg.env)
    tasks = select_tasks(env, cfg.env)
    episodes = OUT / "concurrency" / f"c{concurrency}" / "episodes.jsonl"
    episodes.unlink(missing_ok=True)
    pool = EnginePool()
    try:
        models = build_models(cfg, env, pool, ("specagent",), batch=True)
        for engine in {models.strong, models.weak}:
            if isinstance(engine.engine, ScriptedEngine):
                engine.engine.latency_s = scripted_latency
        began = time.perf_counter()
        records = run_tasks(env, tasks, ["specagent"], models, protocol_config(cfg.protocol, cfg.env), episodes,
                            concurrency=concurrency, env_factory=lambda: build_env(cfg.env))
        rate = throughput(len(records), time.perf_counter() - began, concurrency, models)
    finally:
        pool.close()
    summary = summarize(records)["specagent"]
    calls = sum(e["engine_calls"] for e in rate["engines"])
    return {
        "concurrency": concurrency,
        "episodes": len(records),
        "seconds": rate["seconds"],
        "episodes_per_min": rate["episodes_per_min"],
        "mean_engine_batch": sum(e["requests"] for e in rate["engines"]) / calls if calls else None,
        "max_engine_batch": max((e["max_batch"] for e in rate["engines"]), default=None),
        "acceptance": summary["acceptance_rate"],
        "success": summary["success"]["mean"],
        "strong_decode_tokens": summary["strong_decode_tokens"],
        "wall_per_episode_s": summary["wall_seconds"] / len(records),
        "engines": rate["engines"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [" | ".join(COLUMNS), " | ".join("---" for _ in COLUMNS)]
    for r in rows:
        lines.append(" | ".join([
            str(r["concurrency"]), cell(r["episodes_per_min"], ".1f"), cell(r["mean_engine_batch"], ".2f"),
            cell(r["acceptance"], ".3f"), str(r["strong_decode_tokens"]), cell(r["wall_per_episode_s"], ".2f"),
        ]))  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/run/store_smollm2_vllm.yaml")
    parser.add_argument("--tasks", type=int, default=16, help="the first N tasks of the environment")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--scripted-latency", type=float, default=0.05, help="seconds per call of a scripted engine")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="override config values")
    args = parser.parse_args()

    cfg = load_config(RunConfig, args.config, [*args.overrides, f"env.limit={args.tasks}"])
    rows = []
    for level in args.levels:
        rows.append(run_level(cfg, level, args.scripted_latency))
        print(f"concurrency {level}: {rows[-1]['episodes']} episodes in {rows[-1]['seconds']:.1f}s", flush=True)
    print(table(rows))
    OUT.mkdir(parents=True, exist_ok=True)
    result = {"config": args.config, "tasks": args.tasks, "overrides": args.overrides,
              "scripted_latency_s": args.scripted_latency, "levels": rows}
    (OUT / "concurrency.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {OUT / 'concurrency.json'}")


if __name__ == "__main__":
    main()
