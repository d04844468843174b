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

from transformers import TrainerCallback

from specagent.config import DrafterTrainConfig
from specagent.core.errors import ConfigError
from specagent.core.types import Message, ToolSpec
from specagent.engines.render import FULL, PromptProfile, profile_named
from specagent.records.rows import chat_json, to_dataset_dict, trajectory_rows
from specagent.runtime.provenance import write_run_info
from specagent.train.common import (
    JsonlLog,
    check_training,
    is_main_process,
    load_splits,
    load_tokenizer,
    lora_config,
    model_dir,
    peak_rss_gib,
    set_threads,
    training_kwargs,
)

COLUMNS = ("messages", "tools")


def drafter_data(cfg: DrafterTrainConfig, profile: PromptProfile = FULL) -> tuple[Any, Any | None]:
    """(train, validation) conversational rows, filtered by reward, with only `messages` and `tools`,
    rendered under `profile` (the rows the runtime will serve)."""
    if isinstance(cfg.dataset, list) or cfg.dataset.endswith(".jsonl"):
        train, validation = trajectory_rows(cfg.dataset), None
    else:
        train, validation = load_splits(cfg.dataset, None)

    def keep(split, name: str):
        if split is None:
            return None
        if cfg.min_reward is not None:  # the strong model's successful runs; unknown rewards stay
            before = len(split)
            split = split.filter(lambda r: r["reward"] is None or r["reward"] >= cfg.min_reward)
            if before > len(split):
                print(f"drafter: min_reward={cfg.min_reward:g} leaves out {before - len(split)} of {before} {name} "
                      "rows (runs that failed; min_reward: null keeps them)")
        return profiled(split.select_columns(list(COLUMNS)), profile)

    train = keep(train, "training")
    if cfg.limit is not None:
        train = train.select(range(min(cfg.limit, len(train))))
    if len(train) == 0:
        raise ConfigError(f"dataset: no training rows left in {cfg.dataset} "
                          f"(min_reward={cfg.min_reward}, limit={cfg.limit})")
    validation = keep(validation, "validation")
    return train, validation if validation is not None and len(validation) else None


def profiled(rows: Any, profile: PromptProfile) -> Any:
    """Rows with `profile.apply`ed: the same function the engines render prompts with."""
    if profile == FULL:
        return rows
    out = []
    for row in rows:
        messages, tools = profile.apply([Message.from_openai(m) for m in row["messages"]],
                                        [ToolSpec.from_openai(t) for t in row["tools"]])
        out.append({"messages": chat_json(messages), "tools": [t.to_openai() for t in tools]})
    return to_dataset_dict({"rows": out}, COLUMNS)["rows"]


def training_profile(cfg: DrafterTrainConfig, base_dir: str | None) -> PromptProfile:
    """The configured profile, else the one saved with the base model, else the full prompt."""
    return profile_named(cfg.prompt_profile) if cfg.prompt_profile else PromptProfile.load(base_dir)


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

        model = AutoModelForCausalLM.from_pretrained(path, dtype=cfg.dtype)
    if cfg.from_layers is not None:
        model = first_layers(model, cfg.from_layers)
    profile = training_profile(cfg, path)
    train, validation = drafter_data(cfg, profile)
    callbacks = [JsonlLog(Path(cfg.output_dir) / "log.jsonl"), ProfileInCheckpoints(profile), *callbacks]
    if cfg.acceptance is not None:
        from specagent.train.acceptance import AcceptanceCallback

        callbacks.append(AcceptanceCallback(cfg.acceptance, tokenizer, Path(cfg.output_dir) / "acceptance.jsonl",
                                            threads=cfg.train.threads))
    trainer = target_token_trainer()(
        model=model, args=sft_config(cfg, validation is not None), train_dataset=train, eval_dataset=validation,
        processing_class=tokenizer, peft_config=lora_config(cfg.lora, "CAUSAL_LM") if cfg.lora else None,
        callbacks=callbacks)
    trainer.prompt_profile = profile  # saved beside the adapter by save_final
    trainer.merge_into_model = cfg.from_layers is not None
    trainer.base_model_name = cfg.model + (f" ({layers_named(cfg.from_layers)})" if cfg.from_layers else "")
    for callback in callbacks:
        if hasattr(callback, "bind"):
            callback.bind(trainer)
    trainer.truncation = report_truncation(trainer, train, cfg.max_length)
    return trainer


def target_token_trainer() -> type:
    """SFTTrainer whose loss runs the LM head on the target (assistant) positions only.

    Most of a row is context (observations, user turns) that carries no loss; projecting
    only the target positions through the 49K-word LM head, in one matmul under the
    trainer's autocast, trains ~2x faster on CPU than TRL's tiled fused head (measured on
    SmolLM2, bf16 autocast). The loss is the same token-mean cross-entropy."""
    import torch
    from trl import SFTTrainer

    class TargetTokenSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if return_outputs:
                return super().compute_loss(model, inputs, True, num_items_in_batch)
            causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
            labels = inputs["labels"][:, 1:]
            context = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "position_ids")}
            with self.accelerator.autocast():
                hidden = causal_lm.get_decoder()(**context, use_cache=False).last_hidden_state[:, :-1]
                target = labels != -100
                logits = causal_lm.get_output_embeddings()(hidden[target]).float()
            token_loss = torch.nn.functional.cross_entropy(logits, labels[target], reduction="none")
            count = target.sum() if num_items_in_batch is None else num_items_in_batch
            loss = token_loss.sum() / torch.as_tensor(count).clamp(min=1)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            self._log_target_metrics(logits.detach(), labels[target], inputs)
            return loss

        def _log_target_metrics(self, logits, targets, inputs) -> None:
            mode = "train" if self.model.training else "eval"
            n = max(len(targets), 1)
            log_probs = logits.log_softmax(-1)
            self._metrics[mode]["entropy"].append(float(-(log_probs.exp() * log_probs).sum(-1).sum()) / n)
            self._metrics[mode]["mean_token_accuracy"].append(float((logits.argmax(-1) == targets).sum()) / n)
            if mode == "train":
                self._total_train_tokens += int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else 0
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

    return TargetTokenSFTTrainer


class ProfileInCheckpoints(TrainerCallback):
    """Every checkpoint-N carries the prompt profile, so an export of it renders as trained."""

    def __init__(self, profile: PromptProfile) -> None:
        self.profile = profile

    def on_save(self, args, state, control, **kwargs):
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            self.profile.save(checkpoint)


def first_layers(model: Any, layers: int | Sequence[int]) -> Any:
    """The model cut to its first ``k`` decoder layers (an int) or to the listed ones in order,
    embeddings, final norm and LM head kept: a drafter that reads S's own representation and
    costs len(layers)/L of its layers per token. The kept layers are renumbered 0..n-1, so the
    result is an ordinary checkpoint of the same architecture that every engine loads."""
    import torch

    decoder = model.get_decoder()
    total = len(decoder.layers)
    keep = list(range(layers)) if isinstance(layers, int) else list(layers)
    if len(keep) >= total or keep[-1] >= total:
        raise ConfigError(f"from_layers={layers}: the model has {total} decoder layers (0..{total - 1}); "
                          "keep fewer, by index")
    decoder.layers = torch.nn.ModuleList([decoder.layers[i] for i in keep])
    for new, layer in enumerate(decoder.layers):  # the KV cache is indexed by layer_idx
        attention = getattr(layer, "self_attn", None)
        if attention is not None and hasattr(attention, "layer_idx"):
            attention.layer_idx = new
    config = model.config.get_text_config()
    config.num_hidden_layers = len(keep)
    if getattr(config, "layer_types", None):  # per-layer attention kinds (sliding / full) in newer configs
        config.layer_types = [config.layer_types[i] for i in keep]
    return model


def layers_named(layers: int | Sequence[int]) -> str:
    return f"first {layers} decoder layers" if isinstance(layers, int) else f"decoder layers {list(layers)}"


def report_truncation(trainer: Any, rows: Any, max_length: int | None) -> dict[str, Any] | None:
    """Say what max_length removed: rows cut, rows dropped (TRL drops a row whose every target
    token was cut away: it is never trained on), and the share of target (assistant) tokens
    lost. A silent cut trains on far less than expected. Recorded in metrics.json."""
    if max_length is None:
        return None
    kept = len(trainer.train_dataset)
    if kept == 0:
        raise ConfigError(f"max_length={max_length}: every training row was cut before its first assistant "
                          "turn (the system prompt and tools alone are longer); raise max_length, or use a "
                          "shorter prompt profile (prompt_profile: compact | bare)")
    cut = sum(len(ids) >= max_length for ids in trainer.train_dataset["input_ids"])
    report = {"max_length": max_length, "rows": len(rows), "rows_cut": cut, "rows_dropped": len(rows) - kept}
    if cut or kept < len(rows):
        trained = sum(sum(t != -100 for t in labels) for labels in trainer.train_dataset["labels"])
        total = sum(sum(trainer.processing_class.apply_chat_template(
            row["messages"], tools=row["tools"] or None, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True)["assistant_masks"]) for row in rows)
        report.update(target_tokens=total, target_tokens_cut=total - trained)
        print(f"drafter: max_length={max_length} cuts {cut} of {len(rows)} training rows and drops "
              f"{len(rows) - kept} (no target token left: not trained on); {total - trained} of {total} target "
              f"tokens ({100 * (total - trained) / max(total, 1):.0f}%) are cut away. Raise max_length, or use a "
              "shorter prompt profile, to train on later turns.")
    return report


def train_drafter(cfg: DrafterTrainConfig, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Train, resume if asked, save the final adapter in `output_dir/adapter`. Returns the metrics."""
    set_threads(cfg.train.threads)
    files = [cfg.dataset] if isinstance(cfg.dataset, str) else list(cfg.dataset)
    is_jsonl = isinstance(cfg.dataset, list) or cfg.dataset.endswith(".jsonl")
    checkpoint = check_training(cfg, files if is_jsonl else [], [] if is_jsonl else files)
    trainer = drafter_trainer(cfg, model, tokenizer)
    if is_main_process():  # the run files once everything loaded; the profile also for exports of checkpoint-N dirs
        write_run_info(cfg.output_dir, cfg)
        trainer.prompt_profile.save(cfg.output_dir)
    if checkpoint:
        print(f"resuming from {checkpoint}")
    result = trainer.train(resume_from_checkpoint=checkpoint)
    return save_final(trainer, cfg.output_dir, result.metrics)


def run_readme(base_model: str, weights: str) -> str:
    return (f"# specagent training output\n\nTrained by `specagent train drafter` from base model `{base_model}`.\n"
            f"Weights in `{weights}/`, with the prompt profile they were trained with (`prompt_profile.json`); "
            "`config.yaml`, `metrics.json`, `log.jsonl` and `versions.json` beside them.\n\n"
            "Export it for serving, behind a smoke gate, with `specagent export <this dir> -o <export dir>`; the "
            "export's README is the model card.\n")


def save_final(trainer: Any, output_dir: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The adapter (+ tokenizer with the template) in `output_dir/adapter`, or for a full model
    (full fine-tuning, or a drafter cut from the model's first layers) the checkpoint in
    `output_dir/model`; the prompt profile beside either; and `metrics.json`."""
    out = Path(output_dir)
    full = not hasattr(trainer.model, "peft_config") or getattr(trainer, "merge_into_model", False)
    target = out / ("model" if full else "adapter")
    if full and hasattr(trainer.model, "peft_config"):  # a LoRA on a cut model: merged, the cut model is new
        trainer.model.merge_and_unload().save_pretrained(str(target))
    else:
        trainer.save_model(str(target))  # peft: adapter weights + adapter_config.json; else the full model
    metrics = {**metrics, "global_step": trainer.state.global_step, "peak_rss_gib": peak_rss_gib(),
               "truncation": getattr(trainer, "truncation", None),
               "acceptance": [r for r in trainer.state.log_history if "acceptance_rate" in r]}
    if trainer.is_world_process_zero():
        trainer.prompt_profile.save(target)  # how its prompts are rendered: the runtime reads it
        trainer.processing_class.save_pretrained(str(target))
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
        for where in (out, target):  # in place of TRL's card, which names a local base model "None"
            (where / "README.md").write_text(run_readme(getattr(trainer, "base_model_name", "?"), target.name))
        print(f"{target.name}: {target}   metrics: {out / 'metrics.json'}")
    return metrics
