"""Aggregate episode records into the metrics of DESIGN §3 (one definition for every stage).

Works on the JSON records of `episodes.jsonl`, so it can summarise a file from any run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Sequence

from specagent.core.accounting import Ledger


def mean_ci(values: Sequence[float], z: float = 1.96) -> dict[str, float | int | None]:
    """Mean with a normal-approximation 95% interval (over tasks/episodes)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    mean = sum(values) / n
    if n == 1:
        return {"mean": mean, "lo": mean, "hi": mean, "n": 1}
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = z * math.sqrt(var / n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize_mode(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Sums and rates over the episodes of one mode."""
    ledger = Ledger()
    per_tool: dict[str, dict[str, int]] = defaultdict(lambda: {"drafted": 0, "accepted": 0})
    prefixes: list[float] = []
    for rec in records:
        ledger.merge(Ledger.from_json(rec["ledger"]))
        for tool, entry in rec["counts"]["per_tool"].items():
            per_tool[tool]["drafted"] += entry["drafted"]
            per_tool[tool]["accepted"] += entry["accepted"]
        if rec["counts"]["mean_accepted_prefix"] is not None:
            prefixes.append(rec["counts"]["mean_accepted_prefix"])
    counts = {k: sum(r["counts"][k] for r in records) for k in
              ("drafted_steps", "accepted_steps", "held_approved", "repairs", "malformed_drafts", "rounds")}
    strong, weak = ledger.total("strong"), ledger.total("weak")
    return {
        "episodes": len(records),
        "success": mean_ci([r["reward"] for r in records]),
        **counts,
        "acceptance_rate": _ratio(counts["accepted_steps"], counts["drafted_steps"]),
        "mean_accepted_prefix": sum(prefixes) / len(prefixes) if prefixes else None,
        "per_tool": {k: dict(v, rate=_ratio(v["accepted"], v["drafted"])) for k, v in sorted(per_tool.items())},
        "strong_decode_tokens": strong.decode_tokens,
        "strong_prefill_tokens": strong.prompt_tokens,
        "strong_cached_tokens": strong.cached_tokens,
        "strong_forward_passes": strong.forward_passes,
        "weak_decode_tokens": weak.decode_tokens,
        "memory_traffic_bytes": strong.memory_bytes + weak.memory_bytes,
        "model_seconds": strong.seconds + weak.seconds,
        "wall_seconds": sum(r["wall_seconds"] for r in records),
        "env_seconds": sum(r["env_seconds"] for r in records),
        "ledger": ledger.to_json(),
    }


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per-mode summaries plus ratios against `strong` (and gap recovered against `weak`)
    on the tasks both runs share."""
    by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        by_mode[rec["mode"]].append(rec)
    out = {mode: summarize_mode(recs) for mode, recs in sorted(by_mode.items())}
    if "strong" in by_mode:
        for mode, summary in out.items():
            mine, base = (summarize_mode(r) if r else None for r in _on_shared_tasks(by_mode[mode], by_mode["strong"]))
            for ratio, key in (("strong_decode_ratio", "strong_decode_tokens"),
                               ("memory_traffic_ratio", "memory_traffic_bytes"), ("wall_time_ratio", "wall_seconds")):
                summary[ratio] = _ratio(mine[key], base[key]) if mine and base else None
    if "strong" in out and "weak" in out:
        s, w = out["strong"]["success"]["mean"], out["weak"]["success"]["mean"]
        for summary in out.values():
            gap = s - w
            summary["gap_recovered"] = (summary["success"]["mean"] - w) / gap if gap else None
    return out


def _on_shared_tasks(a: list[dict], b: list[dict]) -> tuple[list[dict], list[dict]]:
    shared = {r["task_id"] for r in a} & {r["task_id"] for r in b}
    return [r for r in a if r["task_id"] in shared], [r for r in b if r["task_id"] in shared]
