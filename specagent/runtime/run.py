"""`specagent run`: episodes of one mode, their transcript and summary, and the throughput."""

from __future__ import annotations

import json
import time
from typing import Any

from specagent.config import RunConfig
from specagent.core.metrics import summarize
from specagent.core.protocol import Episode, Models
from specagent.engines import EnginePool
from specagent.engines.batching import batch_report
from specagent.runtime.assembly import build_env, build_models, check_models, open_run, protocol_config
from specagent.runtime.episodes import run_tasks
from specagent.runtime.transcript import print_summary, print_transcript


def run_from_config(cfg: RunConfig) -> dict[str, Any]:
    """`specagent run`: episodes, transcript, summary.json. Returns the summary."""
    env, tasks, out_dir, episodes = open_run(cfg, lambda env, tasks: check_models(cfg, env, (cfg.mode,), tasks))
    pool = EnginePool()
    try:
        models = build_models(cfg, env, pool, (cfg.mode,), batch=cfg.concurrency > 1)
        names = {r: getattr(models, r).model_name for r in ("strong", "weak") if getattr(models, r) is not None}
        finished: list[dict[str, Any]] = []

        def on_episode(ep: Episode, record: dict[str, Any]) -> None:
            finished.append(record)
            if cfg.transcript:
                print_transcript(ep, record)

        began = time.perf_counter()
        records = run_tasks(env, tasks, [cfg.mode], models, protocol_config(cfg.protocol, cfg.env), episodes,
                            trials=cfg.trials, model_names=names, on_episode=on_episode,
                            concurrency=cfg.concurrency, env_factory=lambda: build_env(cfg.env),
                            rerun_hazard=cfg.env.rerun_hazard())
        rate = throughput(len(finished), time.perf_counter() - began, cfg.concurrency, models)
    finally:
        pool.close()
    summary = summarize(r for r in records if r["task_id"] in set(tasks))
    if cfg.mode in summary:
        summary[cfg.mode]["throughput"] = rate
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, out_dir)
    print(throughput_line(rate))
    return summary


def throughput(episodes: int, seconds: float, concurrency: int, models: Models) -> dict[str, Any]:
    """Episodes per minute of this invocation (resumed episodes excluded) and, when the
    engines batch, their batch statistics."""
    return {
        "concurrency": concurrency,
        "episodes": episodes,
        "seconds": seconds,
        "episodes_per_min": 60 * episodes / seconds if seconds > 0 else None,
        "engines": batch_report({"strong": models.strong, "weak": models.weak}),
    }


def throughput_line(rate: dict[str, Any]) -> str:
    per_min = rate["episodes_per_min"]
    line = (f"throughput: {rate['episodes']} episodes in {rate['seconds']:.1f}s"
            f" = {per_min or 0:.2f}/min at concurrency {rate['concurrency']}")
    for engine in rate["engines"]:
        line += (f"; {'+'.join(engine['roles'])} engine: {engine['engine_calls']} calls,"
                 f" mean batch {engine['mean_batch']:.2f}, max {engine['max_batch']}")
    return line
