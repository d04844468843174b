"""Verdict quality on labeled segments, and threshold calibration (DESIGN §3, §6).

Pure Python: one place that turns per-step scores (a verdict head's P(valid | prefix))
or predicted accepted-prefix lengths (a generative verdict) into the figures users need:
- `auroc` of step scores against step labels;
- `prefix_accuracy`: the predicted accepted prefix equals the labeled one;
- `false_accept_rate`: invalid steps the verdict would commit (the costly error);
- `false_reject_rate`: valid steps it would send to repair;
- `accept_rate` and a `degenerate` flag for a verdict that accepts or rejects nearly all;
- `dominated`: a verdict that another makes no fewer errors of either kind than, on the same rows.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from specagent.engines.verdict_head import accepted_prefix

DEGENERATE = 0.02  # accepting (or rejecting) all but this share of steps is a degenerate verdict


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """Area under the ROC curve (ties count half); None when one class is missing."""
    pairs = sorted(zip(scores, labels))
    positives = sum(1 for _, y in pairs if y)
    negatives = len(pairs) - positives
    if not positives or not negatives:
        return None
    rank_sum, i = 0.0, 0
    while i < len(pairs):  # average ranks over ties
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        mean_rank = (i + j + 1) / 2
        rank_sum += mean_rank * sum(1 for _, y in pairs[i:j] if y)
        i = j
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def prefix_metrics(predicted: Sequence[int], labels: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Figures of predicted accepted-prefix lengths against prefix-closed step labels."""
    invalid = valid = false_accepts = false_rejects = accepted = steps = exact = 0
    for pred, labs in zip(predicted, labels):
        exact += pred == sum(labs)
        for position, label in enumerate(labs):
            steps += 1
            taken = position < pred
            accepted += taken
            if label:
                valid += 1
                false_rejects += not taken
            else:
                invalid += 1
                false_accepts += taken
    accept_rate = accepted / steps if steps else None
    return {
        "segments": len(labels),
        "steps": steps,
        "valid_steps": valid,
        "prefix_accuracy": exact / len(labels) if labels else None,
        "false_accept_rate": false_accepts / invalid if invalid else None,
        "false_reject_rate": false_rejects / valid if valid else None,
        "accept_rate": accept_rate,
        "degenerate": accept_rate is not None and not DEGENERATE <= accept_rate <= 1 - DEGENERATE,
    }


def head_metrics(scores: Sequence[Sequence[float]], labels: Sequence[Sequence[int]],
                 threshold: float) -> dict[str, Any]:
    """All figures of a verdict head at one threshold; it decodes no token."""
    flat_scores = [s for row in scores for s in row]
    flat_labels = [y for row in labels for y in row]
    predicted = [accepted_prefix(row, threshold) for row in scores]
    return {"threshold": threshold, "auroc": auroc(flat_scores, flat_labels),
            **prefix_metrics(predicted, labels), "decoded_tokens_per_verdict": 0.0}


def dominated(figures: dict[str, Any], by: dict[str, Any]) -> bool:
    """Whether ``by`` (e.g. the untrained greedy rule) is at least as good as ``figures`` (a head at
    its threshold) on both errors on the same rows, and better on one: then the head gains nothing
    there. False where either rate is missing (a class absent)."""
    pairs = [(figures.get(k), by.get(k)) for k in ("false_accept_rate", "false_reject_rate")]
    if any(a is None or b is None for a, b in pairs):
        return False
    return all(b <= a for a, b in pairs) and any(b < a for a, b in pairs)


def calibrate(scores: Sequence[Sequence[float]], labels: Sequence[Sequence[int]], target_false_accept: float) -> float:
    """The lowest threshold whose false-accept rate is at most the target (so acceptance is
    as high as the target allows). Raising the threshold only shortens accepted prefixes,
    so the false-accept rate falls monotonically; past the top score nothing is accepted."""
    candidates = sorted({s for row in scores for s in row})
    candidates.append(math.nextafter(candidates[-1] if candidates else 1.0, math.inf))

    def ok(threshold: float) -> bool:
        far = prefix_metrics([accepted_prefix(row, threshold) for row in scores], labels)["false_accept_rate"]
        return far is None or far <= target_false_accept

    low, high = 0, len(candidates) - 1  # the last candidate accepts nothing: always ok
    while low < high:  # binary search for the first ok candidate (ok is monotone)
        mid = (low + high) // 2
        if ok(candidates[mid]):
            high = mid
        else:
            low = mid + 1
    return candidates[low]
