"""A likelihood head: a verdict learned from the strong model's own token probabilities.

The likelihood verdict (`verdict_likelihood.py`) reads, in one prefill, the strong model's
log-probability of every token of every drafted step and whether it is its greedy choice;
at threshold 1.0 it accepts a step only when greedy decoding would have written it. A
likelihood head reads the same prefill, but maps each step's token entries to a few
features (below) and scores the step with a logistic model trained on labeled drafts of
the drafter in use (`specagent mine` on the strong model's runs, `specagent train verdict`
with ``kind: likelihood``), its threshold calibrated on a split the eval never runs.

Why this shape of head:

- the strong model's weights are not changed, so the verify prefill is the base model's:
  the repair, on the same weights, finds it in the engine's prefix cache (a LoRA head's
  prefill is keyed by its adapter in vLLM and never reused by base-weight requests);
- nothing is decoded, and training is a forward pass per labeled segment and a logistic
  fit, minutes on a CPU;
- training and serving compute the features with the same function over the same scored
  positions (`step_features`), so the two cannot drift.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from specagent.core.errors import ConfigError

HEAD_FILE = "likelihood_head.json"
FEATURES = (
    "off_share",          # share of the step's tokens that are not the strong model's greedy choice
    "any_off",            # 1 if any token is not
    "min_off_logprob",    # the least log-probability among those tokens (0 when there are none)
    "first_off_logprob",  # the log-probability of the first such token (0 when there are none)
    "mean_logprob",       # the mean log-probability of the step's tokens
    "log_tokens",         # log(1 + the step's token count)
    "greedy_run_share",   # share of the step's tokens before the first non-greedy one
)
FLOOR = -20.0  # log-probabilities below this are read as this (a token the model rules out)


def step_features(own: Sequence[Sequence[float]]) -> list[float]:
    """The features of one drafted step from its scored positions ([logprob, is_top] per token)."""
    logprobs = [max(float(lp), FLOOR) for lp, _ in own]
    off = [max(float(lp), FLOOR) for lp, is_top in own if not is_top]
    n = len(logprobs)
    run = next((i for i, (_, is_top) in enumerate(own) if not is_top), n)
    return [
        len(off) / n if n else 0.0,
        1.0 if off else 0.0,
        min(off) if off else 0.0,
        off[0] if off else 0.0,
        sum(logprobs) / n if n else 0.0,
        math.log1p(n),
        run / n if n else 1.0,
    ]


@dataclass(frozen=True)
class LikelihoodHead:
    """A logistic model over `step_features`, standardized with its training rows' mean and scale."""

    weights: tuple[float, ...]
    bias: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    threshold: float = 0.5
    features: tuple[str, ...] = FEATURES
    base_model: str | None = None
    # the tasks whose rows set the threshold: an eval on any of them would grade the threshold
    # on its own answers (runtime.assembly refuses it)
    calibration_tasks: tuple[str, ...] = ()
    degenerate: bool = False  # at its threshold it accepts (or rejects) nearly every calibration step
    target_false_accept: float | None = None
    kind: str = field(default="likelihood-head")

    def score(self, own: Sequence[Sequence[float]]) -> float:
        """P(valid) of one step from its scored positions."""
        z = self.bias + sum(w * (x - m) / s for w, x, m, s in
                            zip(self.weights, step_features(own), self.mean, self.scale))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / HEAD_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @staticmethod
    def find(path: str | Path) -> Path | None:
        """Its file at ``path``: the file itself, or in a dir holding it (a training output dir, or
        its `head/`); None where there is none."""
        path = Path(path)
        return next((c for c in (path, path / HEAD_FILE, path / "head" / HEAD_FILE) if c.is_file()), None)

    @classmethod
    def load(cls, path: str | Path) -> "LikelihoodHead":
        """From its file, or a dir holding it (a training output dir, or its `head/`)."""
        path = Path(path)
        found = cls.find(path)
        if found is None:
            raise ConfigError(f"{path}: no likelihood head here (expected {HEAD_FILE}, from "
                              "`specagent train verdict` with kind likelihood)")
        data = json.loads(found.read_text())
        if tuple(data.get("features", ())) != FEATURES:
            raise ConfigError(f"{path}: a likelihood head over other features ({data.get('features')}); "
                              f"this specagent reads {list(FEATURES)}: retrain it")
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["calibration_tasks"] = tuple(str(t) for t in data.get("calibration_tasks", ()))
        check_numbers(data, path)
        return cls(**data)


def check_numbers(data: dict, path: Path) -> None:
    """A head file's numbers are what `fit` and calibration write: one finite weight, mean and
    positive scale per feature, a finite bias, a threshold in (0, 1]. A NaN threshold compares
    False with every score and would otherwise be refused only by `accepted_prefix`'s care."""
    def real(x: object) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    for name in ("weights", "mean", "scale"):
        values = data.get(name)
        if not isinstance(values, tuple) or len(values) != len(FEATURES) or not all(map(real, values)):
            raise ConfigError(f"{path}: `{name}` must be {len(FEATURES)} finite numbers, one per feature")
    if not all(s > 0 for s in data["scale"]):
        raise ConfigError(f"{path}: every `scale` must be > 0")
    if not real(data.get("bias")):
        raise ConfigError(f"{path}: `bias` must be a finite number")
    threshold = data.get("threshold", 0.5)
    if not real(threshold) or not 0.0 < threshold <= 1.0:
        raise ConfigError(f"{path}: `threshold` {threshold!r} must lie in (0, 1]")


def fit(features: Sequence[Sequence[float]], labels: Sequence[int], l2: float = 1e-3,
        steps: int = 200) -> tuple[tuple[float, ...], float, tuple[float, ...], tuple[float, ...]]:
    """(weights, bias, mean, scale) of an L2-regularized logistic regression (torch, L-BFGS) on
    standardized features. Both classes must be present."""
    import torch

    if len(set(int(y) for y in labels)) < 2:
        raise ConfigError(f"a likelihood head needs valid and invalid steps to learn from; the training rows have "
                          f"only label {sorted(set(labels))} ({len(labels)} steps)")
    x = torch.tensor(features, dtype=torch.float64)
    y = torch.tensor(labels, dtype=torch.float64)
    mean = x.mean(0)
    scale = x.std(0, unbiased=False).clamp_min(1e-6)
    z = (x - mean) / scale
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return (tuple(w.detach().tolist()), float(b.detach()), tuple(mean.tolist()), tuple(scale.tolist()))
