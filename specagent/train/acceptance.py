"""Offline acceptance during training: users care about acceptance, not loss (DESIGN §3, §6).

Every N optimizer steps the model being trained drafts at the cut points of held-out
(validation) trajectories of a `specagent mine` run, under the same DRAFT rules,
environment, labeler and metric definitions as mining (`draft_trajectory`,
`segment_stats`): acceptance = accepted steps / drafted steps.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from transformers import TrainerCallback

from specagent.config import AcceptanceSettings, MineConfig, load_config
from specagent.core.draft import DraftJob
from specagent.core.errors import ConfigError
from specagent.core.metrics import bootstrap_ratio
from specagent.core.types import Trajectory
from specagent.runtime.drafting import (
    DraftSettings,
    DraftStats,
    draft_settings,
    draft_trajectory,
    drafting_environment,
    segment_stats,
)
from specagent.runtime.progress import progress as progress_bar


@dataclass
class HeldOut:
    """The held-out trajectories and how to draft and label on them, as the mine run did."""

    trajectories: list[Trajectory]
    jobs_for: Callable[[Trajectory, Sequence[int]], list[DraftJob]]
    settings: DraftSettings
    max_model_len: int


def held_out(settings: AcceptanceSettings) -> HeldOut:
    """Validation trajectories of a mine output dir (its `mine_config.yaml` and `stats.json`)."""
    from specagent.records.trajectories import read_trajectories

    mined = Path(settings.mined)
    if not (mined / "mine_config.yaml").exists() or not (mined / "stats.json").exists():
        raise ConfigError(f"acceptance.mined: {mined} is not a finished `specagent mine` output dir "
                          "(needs mine_config.yaml and stats.json)")
    mine = load_config(MineConfig, mined / "mine_config.yaml")
    validation = set(json.loads((mined / "stats.json").read_text())["tasks"]["validation"])
    if not validation:
        raise ConfigError(f"acceptance.mined: {mined} has no validation tasks (mine with validation_fraction > 0)")
    trajectories = [t for t in read_trajectories(mine.trajectories)[:: mine.stride][: mine.limit]
                    if t.task_id in validation][: settings.limit]
    mine_settings = draft_settings(mine, labelers=("match",), max_tokens=settings.max_tokens or mine.protocol.max_tokens,
                                   max_cuts=settings.max_cuts_per_trajectory, drafter_adapter=None,
                                   reference_segments=False, batch_trajectories=1)
    jobs_for, _ = drafting_environment(mine, trajectories, mine_settings)
    return HeldOut(trajectories, jobs_for, mine_settings, mine.drafter.max_model_len)


def offline_acceptance(engine: Any, data: HeldOut, progress: str | None = None,
                       keep: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Draft and label at every held-out cut point; the mining figures of DESIGN §3.
    `progress`: a label for a progress bar over the trajectories (none when unset); `keep`: a
    list that receives every labeled segment record (`specagent.segment/v1`), for inspection."""
    stats = DraftStats()
    trajectories = progress_bar(data.trajectories, desc=progress, unit="run", disable=progress is None)
    segments, per_run = [], {}
    for traj in trajectories:
        drafted = draft_trajectory(traj, engine, data.jobs_for, data.settings, stats)
        run = segment_stats(drafted)
        per_run[traj.id] = {"drafted": run["drafted_steps"], "accepted": run["accepted_steps"]}
        segments += drafted
    if keep is not None:
        keep += segments
    figures = segment_stats(segments)
    out = {k: figures[k] for k in ("segments", "drafted_steps", "accepted_steps", "acceptance_rate",
                                   "mean_accepted_prefix", "ended_by", "by_position", "by_tool")}
    runs = list(per_run.values())
    out["acceptance_ci95"] = bootstrap_ratio([r["accepted"] for r in runs], [r["drafted"] for r in runs])
    return {**out, "per_run": per_run}


class AcceptanceCallback(TrainerCallback):
    """Measures offline acceptance with the model being trained, at the start (optional),
    every `every_steps` steps and at the end; logs it with the losses and to a JSONL file."""

    def __init__(self, settings: AcceptanceSettings, tokenizer: Any, path: str | Path,
                 threads: int | None = None, data: HeldOut | None = None) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.path = Path(path)
        self.threads = threads
        self.data = data or held_out(settings)
        self.trainer = None
        self.measured_at: set[int] = set()

    def bind(self, trainer: Any) -> None:
        """Log through the trainer (every reporter sees acceptance next to the loss)."""
        self.trainer = trainer

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.settings.at_start:
            self._measure(state, control, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.settings.every_steps == 0:
            self._measure(state, control, model)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._measure(state, control, model)

    def _measure(self, state, control, model) -> None:
        if not state.is_world_process_zero or state.global_step in self.measured_at:
            return
        self.measured_at.add(state.global_step)
        from specagent.engines.transformers_engine import TransformersEngine

        was_training = model.training
        start = time.perf_counter()
        engine = TransformersEngine.from_model(model, self.tokenizer, max_model_len=self.data.max_model_len,
                                               batch_size=self.settings.batch_size, model_name="training",
                                               threads=self.threads)
        try:
            figures = offline_acceptance(engine, self.data)
        finally:
            model.train(was_training)
        record = {"step": state.global_step, **figures, "seconds": round(time.perf_counter() - start, 2)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        logs = {"acceptance_rate": figures["acceptance_rate"] or 0.0,
                "mean_accepted_prefix": figures["mean_accepted_prefix"] or 0.0,
                "drafted_steps": figures["drafted_steps"]}
        if self.trainer is not None:
            from transformers import Trainer

            should_log = control.should_log
            # the base Trainer.log: TRL's would fold its pending per-step metrics into this record
            Trainer.log(self.trainer, logs)
            control.should_log = should_log  # on_log clears it; the step's own loss record must still come
        else:
            state.log_history.append({"step": state.global_step, **logs})
        print(f"step {state.global_step}: offline acceptance {logs['acceptance_rate']:.3f} "
              f"({figures['accepted_steps']}/{figures['drafted_steps']} steps, {figures['segments']} segments)")
