"""`specagent train verdict` with ``kind: likelihood``: a verdict head over the strong model's own
token probabilities (`engines/likelihood_head.py`), the strong model's weights untouched.

1. Every labeled segment of the mined `verdict` dataset is scored by the strong model in one
   prefill each, the prefill the runtime's likelihood verifier makes (`likelihood_request`), and
   each drafted step becomes its feature vector (`step_features`).
2. A logistic model is fit on the training rows' steps.
3. Its threshold is calibrated on rows of tasks the training never saw (``calibration``, a
   second mined dir, e.g. the drafter's drafts on the strong model's runs of a calibration
   split; else the dataset's validation split) for ``target_false_accept``; the same rows give
   the figures at that threshold, at a sweep of thresholds, and of the untrained rule (the
   likelihood verdict at 1.0: greedy steps only) beside it.
   With ``evaluation`` (a third mined dir, of tasks neither step saw), its rows are scored once
   the threshold is fixed and give the head's held-out figures (`evaluation` in metrics.json).
   ``label_sources`` keeps only rows of those label sources (e.g. drafts without the strong
   model's reference segments).
4. A head that accepts or rejects nearly every calibration step is degenerate: the command
   fails with its figures and saves no head, unless ``allow_degenerate`` (then it is saved,
   flagged, and the runtime serves it only at a threshold given explicitly).
5. A head that the untrained rule beats on the calibration rows (no more false accepts and no
   more false rejects, fewer of one) is saved, with a warning and ``greedy_rule_dominates`` in
   metrics.json: serving it can only cost what the rule would not.

Output under `output_dir`: `head/likelihood_head.json` (what `verifier: {kind: likelihood,
head: <output_dir>}` loads), `metrics.json`, `features.jsonl` (per step: task, label, features,
score; for inspection), `config.yaml`, `versions.json`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from specagent.config import TransformersEngineConfig, VerdictTrainConfig
from specagent.core.errors import ConfigError, SpecAgentError
from specagent.core.files import check_output_dir
from specagent.engines.likelihood_head import FEATURES, LikelihoodHead, fit, step_features
from specagent.engines.verdict_likelihood import (GREEDY, checked_entries, greedy_score, likelihood_request,
                                                  step_entries)
from specagent.records.segments import VerdictRow
from specagent.runtime.provenance import write_run_info
from specagent.train.common import load_splits
from specagent.train.verdict_metrics import calibrate, dominated, head_metrics


class DegenerateHead(SpecAgentError):
    """The calibrated head accepts or rejects nearly every calibration step."""


SWEEP = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def score_rows(engine: Any, rows: Sequence[dict[str, Any]], max_length: int | None, what: str,
               batch: int = 16) -> tuple[list[list[Sequence[Sequence[float]]]], list[list[int]], list[str]]:
    """(per row the scored positions of each step, per row its step labels, per row its task), each
    row scored by the prefill the runtime's likelihood verifier makes (`likelihood_request`),
    ``batch`` rows per engine call; rows longer than ``max_length`` tokens are left out, counted."""
    from tqdm.auto import tqdm

    entries, labels, tasks, dropped = [], [], [], 0
    with tqdm(total=len(rows), desc=f"scoring {what} rows", unit="row") as bar:
        for start in range(0, len(rows), batch):
            pending = []
            for i in range(start, min(start + batch, len(rows))):
                raw = rows[i]
                row = VerdictRow.parse(raw, f"verdict row {raw.get('segment_id')}")
                # the verify prompt without its review request: the likelihood prefill
                request, spans = likelihood_request(engine, row.chat()[:-1], row.tool_specs(),
                                                    row.step_message_indices)
                if max_length is not None and len(request.token_ids) > max_length:
                    dropped += 1
                    continue
                pending.append((request, spans, row))
            for (request, spans, row), scored in zip(pending, engine.score([p[0] for p in pending]) if pending else []):
                entries.append(step_entries(checked_entries(scored.logprobs, len(request.positions)), spans))
                labels.append([int(y) for y in row.labels])
                tasks.append(str(row.task_id))
            bar.update(min(batch, len(rows) - start))
    if dropped:
        print(f"likelihood head: {dropped} of {len(rows)} {what} rows left out (longer than {max_length} tokens)")
    return entries, labels, tasks


def build_scorer(cfg: VerdictTrainConfig) -> Any:
    from specagent.engines import build_engine

    scorer = cfg.scorer or TransformersEngineConfig(model=cfg.model, gguf_file=cfg.gguf_file, dtype=cfg.dtype,
                                                    max_model_len=cfg.max_length or 8192, threads=cfg.train.threads)
    return build_engine(scorer)


def every_split(path: str, key: str) -> Any:
    """Every row of the mined `verdict` dataset at ``path`` (config key ``key``), all splits."""
    from datasets import concatenate_datasets, load_from_disk

    try:
        data = load_from_disk(path)
    except FileNotFoundError:
        raise ConfigError(f"{key}: no dataset at {path} (a `specagent mine` output's `verdict/` dir)") from None
    return concatenate_datasets([data[split] for split in data])


def of_sources(rows: Any, sources: Sequence[str] | None) -> Any:
    """The rows whose label source is one of ``sources`` (all rows when None)."""
    return rows if sources is None else rows.filter(lambda row: row["label_source"] in sources)


def calibration_rows(cfg: VerdictTrainConfig) -> tuple[Any, str]:
    """The rows that choose the threshold, and where they came from."""
    if cfg.calibration:
        return every_split(cfg.calibration, "calibration"), cfg.calibration
    _, validation = load_splits(cfg.dataset, None)
    if validation is None or len(validation) == 0:
        raise ConfigError(f"dataset: {cfg.dataset} has no validation split and no `calibration` dir is set: a "
                          "likelihood head's threshold must be chosen on rows it was not fit on")
    return validation, f"{cfg.dataset} (validation)"


def rule_and_sweep(entries: Sequence[Any], labels: Sequence[Sequence[int]],
                   scores: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Beside a head's figures on some rows: the untrained rule (greedy steps only) on the same
    rows, and the head at a sweep of thresholds."""
    greedy = [[greedy_score(own) for own in steps] for steps in entries]
    return {"greedy_rule": head_metrics(greedy, labels, GREEDY),
            "sweep": [head_metrics(scores, labels, t) for t in SWEEP]}


def line(figures: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())


def tasks_of(rows: Any) -> set[str]:
    return {str(t) for t in rows["task_id"]}


def train_likelihood_head(cfg: VerdictTrainConfig, engine: Any = None) -> dict[str, Any]:
    check_output_dir(cfg.output_dir, "output_dir")
    train, _ = load_splits(cfg.dataset, cfg.limit)
    calibration, source = calibration_rows(cfg)
    train, calibration = of_sources(train, cfg.label_sources), of_sources(calibration, cfg.label_sources)
    shared = sorted(tasks_of(train) & tasks_of(calibration))
    if shared:
        raise ConfigError(f"calibration: {len(shared)} of its tasks are training tasks ({', '.join(shared[:5])}): "
                          "calibrate on tasks the head was not fit on")
    evaluation = of_sources(every_split(cfg.evaluation, "evaluation"), cfg.label_sources) if cfg.evaluation else None
    if evaluation is not None:
        seen = sorted(tasks_of(evaluation) & (tasks_of(train) | tasks_of(calibration)))
        if seen:
            raise ConfigError(f"evaluation: {len(seen)} of its tasks were fit or calibrated on "
                              f"({', '.join(seen[:5])}): evaluate on held-out tasks")
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_run_info(cfg.output_dir, cfg)
    owned = engine is None
    engine = build_scorer(cfg) if owned else engine
    try:
        train_entries, train_labels, train_tasks = score_rows(engine, train, cfg.max_length, "training")
        cal_entries, cal_labels, cal_tasks = score_rows(engine, calibration, cfg.max_length, "calibration")
        held_out = score_rows(engine, evaluation, cfg.max_length, "evaluation") if evaluation is not None else None
    finally:
        if owned:
            getattr(engine, "close", lambda: None)()
    if not train_entries or not cal_entries:
        raise ConfigError(f"no usable rows: {len(train_entries)} training, {len(cal_entries)} calibration "
                          f"(max_length={cfg.max_length})")
    features = [step_features(own) for steps in train_entries for own in steps]
    flat_labels = [y for labels in train_labels for y in labels]
    weights, bias, mean, scale = fit(features, flat_labels, l2=cfg.l2)
    base_model = cfg.scorer.model if cfg.scorer is not None else cfg.model
    unfit = LikelihoodHead(weights=weights, bias=bias, mean=mean, scale=scale, base_model=base_model)
    cal_scores = [[unfit.score(own) for own in steps] for steps in cal_entries]
    threshold = calibrate(cal_scores, cal_labels, cfg.target_false_accept)
    calibrated = head_metrics(cal_scores, cal_labels, threshold)
    head = replace(unfit, threshold=threshold, calibration_tasks=tuple(sorted(set(cal_tasks))),
                   degenerate=bool(calibrated["degenerate"]), target_false_accept=cfg.target_false_accept)
    train_scores = [[unfit.score(own) for own in steps] for steps in train_entries]
    metrics = {
        "kind": "likelihood", "features": list(FEATURES), "weights": list(weights), "bias": bias,
        "threshold": threshold, "target_false_accept": cfg.target_false_accept, "calibration_source": source,
        "calibration_tasks": sorted(set(cal_tasks)), "training_tasks": len(set(train_tasks)),
        "training_segments": len(train_entries), "training_steps": len(flat_labels),
        "training_valid_share": sum(flat_labels) / len(flat_labels),
        "calibrated": calibrated, "degenerate": calibrated["degenerate"],
        "on_training_rows": head_metrics(train_scores, train_labels, threshold),
        **rule_and_sweep(cal_entries, cal_labels, cal_scores),
    }
    metrics["greedy_rule_dominates"] = dominated(calibrated, by=metrics["greedy_rule"])
    scored = [("calibration", cal_tasks, cal_entries, cal_labels, cal_scores)]
    if held_out is not None:  # the threshold is fixed: these rows only measure it
        entries, labels, tasks = held_out
        scores = [[unfit.score(own) for own in steps] for steps in entries]
        at_threshold = head_metrics(scores, labels, threshold)
        metrics["evaluation"] = {"source": cfg.evaluation, "tasks": sorted(set(tasks)), "segments": len(entries),
                                 **at_threshold, **rule_and_sweep(entries, labels, scores)}
        scored.append(("evaluation", tasks, entries, labels, scores))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    with open(out / "features.jsonl", "w") as f:
        for split, split_tasks, split_entries, split_labels, split_scores in scored:
            for task, steps, labels, scores in zip(split_tasks, split_entries, split_labels, split_scores):
                for own, label, score in zip(steps, labels, scores):
                    f.write(json.dumps({"split": split, "task_id": task, "label": label, "score": score,
                                        "features": step_features(own)}) + "\n")
    print(f"likelihood head: {out / 'head'}   metrics: {out / 'metrics.json'}   ({len(flat_labels)} training steps)")
    print(f"calibration ({source}): {line(calibrated)}")
    print(f"greedy rule on the same rows: {line(metrics['greedy_rule'])}")
    if metrics["greedy_rule_dominates"]:
        rule = metrics["greedy_rule"]
        print(f"warning: on the calibration rows the greedy rule (no head) is as good on both errors and better on one "
              f"(false accepts {rule['false_accept_rate']:.3f} against the head's "
              f"{calibrated['false_accept_rate']:.3f}, "
              f"false rejects {rule['false_reject_rate']:.3f} against {calibrated['false_reject_rate']:.3f}): "
              "the head gains nothing over `verifier: {kind: likelihood}` without it")
    if held_out is not None:
        print(f"evaluation ({cfg.evaluation}, at the calibrated threshold): {line(at_threshold)}")
    if not head.degenerate or cfg.allow_degenerate:
        head.save(out / "head")  # what the pipeline's stage and the runtime look for
        return metrics
    raise DegenerateHead(
            f"the likelihood head is degenerate at its threshold {threshold:g} (accept rate "
            f"{calibrated['accept_rate']}, false-reject {calibrated['false_reject_rate']} on its calibration rows): "
            "it would accept or reject nearly every step. Mine more, balanced drafts (or set allow_degenerate: "
            "true to keep it)")
