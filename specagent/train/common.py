"""What the drafter and verdict recipes share: model and tokenizer set-up, LoRA, the
TrainingArguments of an `OptimSettings`, resume, and the run files written next to the output.

The tokenizer always carries specagent's one chat template (engines/render.py), so a
model is trained on exactly the bytes the runtime serves it with (DESIGN §6).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from specagent.config import LoraSettings, OptimSettings, check_resume
from specagent.core.errors import ConfigError
from specagent.core.files import check_output_dir
from specagent.engines.render import load_tokenizer  # noqa: F401  (the recipes load tokenizers from here)


def peak_rss_gib() -> float:
    """The largest resident memory this process (and its finished children) reached, in GiB:
    what a recipe needs here, recorded in metrics.json."""
    import resource

    kib = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return round(kib / 2**20, 2)  # Linux reports KiB


def set_threads(threads: int | None) -> None:
    """torch's CPU threads: the configured count, else the cores this process may use."""
    import torch

    torch.set_num_threads(threads or max(1, min(torch.get_num_threads(), len(os.sched_getaffinity(0)))))


def model_dir(model: str, gguf_file: str | None) -> str:
    """A loadable checkpoint dir (GGUF files are dequantized once and cached)."""
    from specagent.engines.models import materialize

    return materialize(model, gguf_file)


def lora_config(settings: LoraSettings, task_type: str | None) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=settings.target_modules, task_type=task_type)


def training_kwargs(opt: OptimSettings, output_dir: str) -> dict[str, Any]:
    """TrainingArguments (or SFTConfig) fields for an `OptimSettings`; `extra` wins."""
    kwargs = dict(
        output_dir=output_dir, num_train_epochs=opt.epochs, max_steps=opt.max_steps,
        per_device_train_batch_size=opt.batch_size, per_device_eval_batch_size=opt.batch_size,
        gradient_accumulation_steps=opt.grad_accum, learning_rate=opt.learning_rate,
        lr_scheduler_type=opt.lr_scheduler, warmup_steps=opt.warmup_steps, weight_decay=opt.weight_decay,
        max_grad_norm=opt.max_grad_norm, bf16=opt.bf16, gradient_checkpointing=opt.gradient_checkpointing,
        logging_steps=opt.logging_steps, logging_first_step=True, save_strategy="steps", save_steps=opt.save_steps,
        save_total_limit=opt.save_total_limit, seed=opt.seed, data_seed=opt.seed, report_to=opt.report_to,
    )
    if opt.bf16 and not _has_accelerator():
        if cpu_bf16_pays():
            kwargs["use_cpu"] = True  # bf16 autocast on CPU; transformers refuses bf16 without it
        else:
            kwargs["bf16"] = False
            warnings.warn(NO_BF16, stacklevel=2)
    return {**kwargs, **opt.extra}


NO_BF16 = ("bf16: this CPU has no AMX, where bf16 autocast is slower than float32 (a step of the "
           "quickstart's S took 22 s in bf16 against 13 s in float32 on an AVX512-BF16 CPU; ~50x "
           "slower on an AVX2 one): training in float32 instead")


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available()


def cpu_bf16_pays() -> bool:
    """Whether bf16 autocast trains faster than float32 on this CPU: only with AMX's bf16 matrix
    units. With AVX512-BF16 alone a step of the quickstart's S took 22.4 s in bf16 and 12.8 s in
    float32 (tests/train/test_bf16_fallback.py); with AVX2 only, autocast emulates every matmul (a
    step took 12.5 min instead of ~30 s)."""
    import torch

    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):  # a torch without the check: autocast, as before
        return True


def resume_checkpoint(output_dir: str, resume: bool) -> str | None:
    """The last `checkpoint-N` dir under output_dir when resuming, else None."""
    if not resume or not Path(output_dir).is_dir():
        return None
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir)


RESUME_HINT = "train with the saved config, or set resume: false to start over, or choose another output_dir"


def check_training(cfg: Any, trajectory_files: list[str] = (), dataset_dirs: list[str] = ()) -> str | None:
    """Everything about a training run that can be checked before a model loads or a file is
    written: the output dir, the training data (trajectory files read and parsed, dataset dirs
    there) and, when resuming a checkpoint, that it was trained with this config (`check_resume`).
    Returns the checkpoint to resume from, or None."""
    check_output_dir(cfg.output_dir, "output_dir")
    from specagent.records.trajectories import read_trajectories

    for path in trajectory_files:
        read_trajectories(path)  # a TaskFileError naming the file and line
    for path in dataset_dirs:
        if not Path(path).is_dir():
            raise ConfigError(f"dataset: no dataset at {path} (run `specagent mine` first; point at its "
                              "`drafter/` or `verdict/` dir)")
    checkpoint = resume_checkpoint(cfg.output_dir, cfg.resume)
    if checkpoint:
        check_resume(Path(cfg.output_dir) / "config.yaml", cfg, RESUME_HINT)
    return checkpoint


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def load_splits(path: str, limit: int | None) -> tuple[Any, Any | None]:
    """(train, validation or None) of a DatasetDict written by `specagent mine`."""
    from datasets import load_from_disk

    try:
        data = load_from_disk(path)
    except FileNotFoundError:
        raise ConfigError(f"dataset: no dataset at {path} (run `specagent mine` first; point at its "
                          "`drafter/` or `verdict/` dir)") from None
    if "train" not in data:
        raise ConfigError(f"dataset: {path} has no `train` split (splits: {list(data)})")
    train = data["train"]
    if limit is not None:
        train = train.select(range(min(limit, len(train))))
    return train, data.get("validation")


class JsonlLog(TrainerCallback):
    """Every log record (loss, learning rate, acceptance, ...) appended to `log.jsonl`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({"step": state.global_step, "epoch": state.epoch, **logs}) + "\n")
