"""Aggregate episode records into the metrics of DESIGN §3 (one definition for every stage).

Works on the JSON records of `episodes.jsonl`, so it can summarise a file from any run.
Rates and ratios are ratios of sums over tasks (each task's trials averaged first), with a
95% interval over tasks (success: Wilson score; ratios: delta method); comparisons with
the strong and weak runs use the tasks both ran.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any, Iterable, Sequence

from specagent.core.accounting import Ledger
from specagent.core.types import StepStatus

ACCEPTED = (StepStatus.ACCEPTED.value, StepStatus.HELD_APPROVED.value)
# (ratio name, per-episode value) compared with the strong run on the same tasks
RATIOS = (("strong_decode_ratio", "strong_decode_tokens"), ("memory_traffic_ratio", "memory_traffic_bytes"),
          ("wall_time_ratio", "wall_seconds"))


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


def rate_ci(values: Sequence[float], z: float = 1.96) -> dict[str, float | int | None]:
    """Mean of per-task values in [0, 1] (success) with a Wilson score 95% interval: it stays
    inside [0, 1] and is not empty at 0 or at 1 (0 of 36 solved is not "0 for certain")."""
    n = len(values)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    p = sum(values) / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return {"mean": p, "lo": max(0.0, centre - half), "hi": min(1.0, centre + half), "n": n}


def ratio_ci(num: Sequence[float], den: Sequence[float], z: float = 1.96) -> dict[str, float | int | None]:
    """Σnum / Σden over paired values (one pair per task) with a 95% interval by the delta
    method: the ratio's variance is that of the residuals num - r·den over mean(den)²."""
    n, total = len(num), sum(den)
    if n == 0 or not total:
        return {"mean": None, "lo": None, "hi": None, "n": n}
    r = sum(num) / total
    if n == 1:
        return {"mean": r, "lo": r, "hi": r, "n": 1}
    var = sum((a - r * b) ** 2 for a, b in zip(num, den, strict=True)) / (n - 1)
    half = z * math.sqrt(var / n) / abs(total / n)
    return {"mean": r, "lo": r - half, "hi": r + half, "n": n}


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], resamples: int = 2000,
                    seed: int = 0) -> list[float] | None:
    """95% percentile-bootstrap interval of Σnum / Σden over paired values (one pair per run
    or task, resampled with replacement); None when no resample has a non-zero Σden."""
    pairs = list(zip(num, den, strict=True))
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples if pairs else 0):
        pick = [rng.choice(pairs) for _ in pairs]
        total = sum(b for _, b in pick)
        if total:
            ratios.append(sum(a for a, _ in pick) / total)
    if not ratios:
        return None
    ratios.sort()
    return [ratios[int(0.025 * (len(ratios) - 1))], ratios[int(0.975 * (len(ratios) - 1))]]


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def episode_values(rec: dict[str, Any]) -> dict[str, float]:
    """The per-episode quantities that rates and ratios are built from."""
    ledger = Ledger.from_json(rec["ledger"])
    strong, weak = ledger.total("strong"), ledger.total("weak")
    return {
        "reward": rec["reward"],
        "accepted_steps": rec["counts"]["accepted_steps"],
        "drafted_steps": rec["counts"]["drafted_steps"],
        "accepted_prefix_sum": sum(rec["accepted_prefixes"]),
        "rounds": len(rec["accepted_prefixes"]),
        "strong_decode_tokens": strong.decode_tokens,
        "memory_traffic_bytes": strong.memory_bytes + weak.memory_bytes,
        "wall_seconds": rec["wall_seconds"],
    }


def task_means(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per task, the mean over its trials of every `episode_values` quantity."""
    by_task: dict[str, list[dict[str, float]]] = defaultdict(list)
    for rec in records:
        by_task[str(rec["task_id"])].append(episode_values(rec))
    return {task: {k: sum(v[k] for v in vals) / len(vals) for k in vals[0]} for task, vals in by_task.items()}


def acceptance_by_position(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Drafted and accepted steps by position within their round's segment (1 = first drafted)."""
    out: dict[int, dict[str, int]] = defaultdict(lambda: {"drafted": 0, "accepted": 0})
    for rec in records:
        position: dict[int, int] = defaultdict(int)
        for step in rec["steps"]:
            if step["source"] != "weak" or step["status"] == StepStatus.AUTHORED.value:
                continue
            position[step["round"]] += 1
            entry = out[position[step["round"]]]
            entry["drafted"] += 1
            entry["accepted"] += step["status"] in ACCEPTED
    return {str(k): dict(v, rate=_ratio(v["accepted"], v["drafted"])) for k, v in sorted(out.items())}


def token_table(ledger: Ledger) -> dict[str, dict[str, dict[str, int]]]:
    """Tokens per model and role: prefill split into new and cache-hit, and decode."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for (model, role), stats in sorted(ledger.entries.items()):
        out.setdefault(model, {})[role] = {"prefill_new": stats.prompt_tokens - stats.cached_tokens,
                                           "prefill_cached": stats.cached_tokens, "decode": stats.decode_tokens}
    return out


def summarize_group(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Sums, rates and intervals over the episodes of one mode (or one eval arm)."""
    ledger = Ledger()
    per_tool: dict[str, dict[str, int]] = defaultdict(lambda: {"drafted": 0, "accepted": 0})
    for rec in records:
        ledger.merge(Ledger.from_json(rec["ledger"]))
        for tool, entry in rec["counts"]["per_tool"].items():
            per_tool[tool]["drafted"] += entry["drafted"]
            per_tool[tool]["accepted"] += entry["accepted"]
    # continued_repairs, unsure_drafts: newer records only
    counts = {k: sum(r["counts"].get(k, 0) for r in records) for k in
              ("drafted_steps", "accepted_steps", "held_approved", "repairs", "continued_repairs", "malformed_drafts",
               "unsure_drafts", "rounds")}
    tasks = task_means(records)
    column: dict[str, list[float]] = defaultdict(list)  # one value per task
    for values in tasks.values():
        for key, value in values.items():
            column[key].append(value)
    ci = {
        "acceptance_rate": ratio_ci(column["accepted_steps"], column["drafted_steps"]),
        "mean_accepted_prefix": ratio_ci(column["accepted_prefix_sum"], column["rounds"]),
        **{key: mean_ci(column[key]) for _, key in RATIOS},  # per episode
    }
    strong, weak = ledger.total("strong"), ledger.total("weak")
    return {
        "episodes": len(records),
        # an accepted loop (a drafter repeating a lookup the verifier keeps approving) ends here
        "max_steps_episodes": sum(r["stop_reason"] == "max_steps" for r in records),
        "tasks": len(tasks),
        "success": rate_ci(column["reward"]),
        **counts,
        "acceptance_rate": ci["acceptance_rate"]["mean"],
        "mean_accepted_prefix": ci["mean_accepted_prefix"]["mean"],
        "per_tool": {k: dict(v, rate=_ratio(v["accepted"], v["drafted"])) for k, v in sorted(per_tool.items())},
        "by_position": acceptance_by_position(records),
        "strong_decode_tokens": strong.decode_tokens,
        "strong_prefill_tokens": strong.prompt_tokens,
        "strong_cached_tokens": strong.cached_tokens,
        "strong_forward_passes": strong.forward_passes,
        "weak_decode_tokens": weak.decode_tokens,
        "weak_forward_passes": weak.forward_passes,
        "memory_traffic_bytes": strong.memory_bytes + weak.memory_bytes,
        "model_seconds": strong.seconds + weak.seconds,
        "wall_seconds": sum(r["wall_seconds"] for r in records),
        "env_seconds": sum(r["env_seconds"] for r in records),
        "tokens": token_table(ledger),
        "network": ledger.network_json(),  # what crossed the network to remote engines (edge–cloud)
        "ci": ci,
        "ledger": ledger.to_json(),
    }


def compare(
    mine: dict[str, dict[str, float]],
    strong: dict[str, dict[str, float]] | None,
    weak: dict[str, dict[str, float]] | None,
) -> dict[str, dict[str, float | int | None]]:
    """Ratios against the strong run and the gap recovered between weak and strong, on the
    tasks they share, from `task_means` of each."""
    out: dict[str, dict[str, float | int | None]] = {}
    shared = sorted(mine.keys() & strong.keys()) if strong is not None else []
    for ratio, key in RATIOS:
        out[ratio] = ratio_ci([mine[t][key] for t in shared], [strong[t][key] for t in shared])
    both = sorted(mine.keys() & strong.keys() & weak.keys()) if strong is not None and weak is not None else []
    # (success - weak) / (strong - weak) is a ratio of sums over tasks of these differences
    out["gap_recovered"] = ratio_ci([mine[t]["reward"] - weak[t]["reward"] for t in both],
                                    [strong[t]["reward"] - weak[t]["reward"] for t in both])
    return out


def summarize(
    records: Iterable[dict[str, Any]], by: str = "mode", strong: str | None = "strong", weak: str | None = "weak"
) -> dict[str, Any]:
    """Per-group summaries (grouped by the records' `by` field: `mode`, or `arm` in an eval),
    with ratios against group ``strong`` and the gap recovered between ``weak`` and ``strong``
    (None where a reference group is missing or the gap is zero)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        groups[rec.get(by, rec["mode"])].append(rec)
    means = {name: task_means(recs) for name, recs in groups.items()}
    base = means.get(strong) if strong else None
    low = means.get(weak) if weak else None
    out = {}
    for name, recs in sorted(groups.items()):
        summary = summarize_group(recs)
        for key, ci in compare(means[name], base, low).items():
            summary[key] = ci["mean"]
            summary["ci"][key] = ci
        out[name] = summary
    return out
