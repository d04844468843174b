"""`specagent train drafter`: LoRA SFT of the weak model on the mined `drafter` dataset.

Setup → train → save. TRL's SFTTrainer does the work: the dataset's `messages` and
`tools` are rendered by specagent's chat template (the one the runtime serves with),
and only the assistant turns (the strong model's steps, inside the template's
`{% generation %}` block) carry loss. Output under `output_dir`: `checkpoint-N/`
(resumable), `adapter/` (the final peft adapter + tokenizer), `log.jsonl`,
`metrics.json`, `config.yaml`, `versions.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from specagent.config import DrafterTrainConfig
from specagent.core.errors import ConfigError
from specagent.train.common import (
    DTYPES, JsonlLog, is_main_process, load_splits, load_tokenizer, lora_config, model_dir, resume_checkpoint,
    set_threads, training_kwargs, write_run_info,
)

COLUMNS = ("messages", "tools")


def drafter_data(cfg: DrafterTrainConfig) -> tuple[Any, Any | None]:
    """(train, validation) conversational rows, filtered by reward, with only `messages` and `tools`."""
    train, validation = load_splits(cfg.dataset, None)

    def keep(split):
        if split is None:
            return None
        if cfg.min_reward is not None:
            split = split.filter(lambda r: r["reward"] is not None and r["reward"] >= cfg.min_reward)
        return split.select_columns(list(COLUMNS))

    train = keep(train)
    if cfg.limit is not None:
        train = train.select(range(min(cfg.limit, len(train))))
    if len(train) == 0:
        raise ConfigError(f"dataset: no training rows left in {cfg.dataset} "
                          f"(min_reward={cfg.min_reward}, limit={cfg.limit})")
    validation = keep(validation)
    return train, validation if validation is not None and len(validation) else None


def sft_config(cfg: DrafterTrainConfig, has_validation: bool) -> Any:
    from trl import SFTConfig

    kwargs = training_kwargs(cfg.train, cfg.output_dir)
    if has_validation and "eval_strategy" not in cfg.train.extra:
        kwargs.update(eval_strategy="steps", eval_steps=cfg.train.save_steps)
    return SFTConfig(**{"assistant_only_loss": True, "max_length": cfg.max_length, **kwargs})


def drafter_trainer(cfg: DrafterTrainConfig, model: Any = None, tokenizer: Any = None,
                    callbacks: Sequence[Any] = ()) -> Any:
    """An SFTTrainer for the config. `model`/`tokenizer` default to the configured weak model;
    tests pass tiny in-process ones. LoRA is applied by the trainer (peft)."""
    from trl import SFTTrainer

    path = None if model is not None and tokenizer is not None else model_dir(cfg.model, cfg.gguf_file)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path)
    if model is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[cfg.dtype])
    train, validation = drafter_data(cfg)
    callbacks = [JsonlLog(Path(cfg.output_dir) / "log.jsonl"), *callbacks]
    if cfg.acceptance is not None:
        from specagent.train.acceptance import AcceptanceCallback

        callbacks.append(AcceptanceCallback(cfg.acceptance, tokenizer, Path(cfg.output_dir) / "acceptance.jsonl",
                                            threads=cfg.train.threads))
    trainer = SFTTrainer(model=model, args=sft_config(cfg, validation is not None), train_dataset=train,
                         eval_dataset=validation, processing_class=tokenizer,
                         peft_config=lora_config(cfg.lora, "CAUSAL_LM"), callbacks=callbacks)
    for callback in callbacks:
        if hasattr(callback, "bind"):
            callback.bind(trainer)
    report_truncation(trainer, len(train), cfg.max_length)
    return trainer


def report_truncation(trainer: Any, rows: int, max_length: int | None) -> None:
    """Say how many rows max_length cut or dropped: a silent cut trains on far less than expected."""
    if max_length is None:
        return
    kept = len(trainer.train_dataset)
    if kept == 0:
        raise ConfigError(f"max_length={max_length}: every training row was cut before its first assistant "
                          "turn (the system prompt and tools alone are longer); raise max_length")
    cut = sum(len(ids) >= max_length for ids in trainer.train_dataset["input_ids"])
    if cut or kept < rows:
        print(f"drafter: {cut} of {rows} training rows cut at max_length={max_length}; {rows - kept} dropped "
              "(no assistant token left). Raise max_length to train on later turns.")


def train_drafter(cfg: DrafterTrainConfig, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Train, resume if asked, save the final adapter in `output_dir/adapter`. Returns the metrics."""
    set_threads(cfg.train.threads)
    if is_main_process():
        write_run_info(cfg.output_dir, cfg)
    trainer = drafter_trainer(cfg, model, tokenizer)
    checkpoint = resume_checkpoint(cfg.output_dir, cfg.resume)
    if checkpoint:
        print(f"resuming from {checkpoint}")
    result = trainer.train(resume_from_checkpoint=checkpoint)
    return save_final(trainer, cfg.output_dir, result.metrics)


def save_final(trainer: Any, output_dir: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The adapter (+ tokenizer with the template) in `output_dir/adapter`, and `metrics.json`."""
    out = Path(output_dir)
    trainer.save_model(str(out / "adapter"))  # peft: adapter weights + adapter_config.json only
    metrics = {**metrics, "global_step": trainer.state.global_step,
               "acceptance": [r for r in trainer.state.log_history if "acceptance_rate" in r]}
    if trainer.is_world_process_zero():
        trainer.processing_class.save_pretrained(str(out / "adapter"))
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
        print(f"adapter: {out / 'adapter'}   metrics: {out / 'metrics.json'}")
    return metrics
