"""`specagent train verdict`: the strong model's verdict, as a head or as a generative adapter.

- `kind: head`: a LoRA adapter on the strong model read as a classifier
  (`specagent.engines.verdict_head`): at the `<|im_end|>` closing each drafted step in
  the rendered verify prompt, P(valid | prefix) = sigmoid(logit[yes] - logit[no]) of the
  next-token logits. The loss is binary cross-entropy on that difference at the
  boundaries only (labels 0/1 there, -100 elsewhere), plus a small term that keeps the
  two tokens' probability mass high so that vLLM's `prompt_logprobs` (top-k) always
  reports both. One forward pass scores every step; the verdict is the longest prefix
  above a threshold calibrated on validation for a target false-accept rate; no token is
  decoded. Being a plain causal-LM LoRA, the same engine that repairs serves it.
- `kind: generative`: SFT (TRL) of a LoRA adapter on the verify prompt -> concise
  verdict (`prompt`/`completion`) pairs, the verdict the runtime parses.
- `kind: likelihood`: no weights trained: a logistic model over the strong model's own token
  probabilities of each drafted step (`specagent.train.likelihood_head`).

Output under `output_dir`: checkpoints, `adapter/` (+ `verdict.json`: kind, threshold,
tokens, base model), `metrics.json` (validation figures, `verdict_metrics.py`),
`log.jsonl`, `config.yaml`, `versions.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from specagent.config import VerdictTrainConfig
from specagent.core.errors import ConfigError
from specagent.core.types import Message, ToolSpec
from specagent.engines.render import FULL, PromptProfile, load_template, template_messages
from specagent.engines.verdict_head import DEFAULT_THRESHOLD, HeadSpec, boundary_positions, probability
from specagent.records.segments import VerdictRow
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
from specagent.train.verdict_metrics import calibrate, head_metrics, prefix_metrics

# --------------------------------------------------------------------- data

IGNORE = -100


def token_labels(tokenizer: Any, example: dict[str, Any], profile: PromptProfile = FULL) -> dict[str, list[int]]:
    """A `verdict` dataset row -> input_ids, labels (0/1 at step boundaries, -100 elsewhere)
    and act_labels (the token ids of the strong model's own turns in the committed context,
    -100 elsewhere), rendered under the strong model's prompt profile."""
    row = VerdictRow.parse(example, f"verdict row {example.get('segment_id')}")
    messages, tools = row.chat(), row.tool_specs()
    ids, positions = boundary_positions(tokenizer, messages, tools, row.step_message_indices, profile=profile)
    labels = [IGNORE] * len(ids)
    for position, label in zip(positions, row.labels):
        labels[position] = int(label)
    return {"input_ids": ids, "labels": labels, "act_labels": context_turns(tokenizer, messages[: row.step_message_indices[0]], tools, ids, profile)}


def context_turns(tokenizer: Any, context: Sequence[Message], tools: Sequence[ToolSpec], ids: list[int],
                  profile: PromptProfile) -> list[int]:
    """``ids`` at the assistant tokens of the rendered ``context`` (a prefix of them), -100 elsewhere."""
    if not any(m.role == "assistant" for m in context):
        return [IGNORE] * len(ids)
    messages, shown = profile.apply(context, tools)
    rendered = tokenizer.apply_chat_template(template_messages(messages), chat_template=load_template(),
                                             tools=[t.to_openai() for t in shown] or None, tokenize=True,
                                             return_dict=True, return_assistant_tokens_mask=True)
    mask = rendered["assistant_masks"]
    return [ids[i] if i < len(mask) and mask[i] else IGNORE for i in range(len(ids))]


def boundary_example(tokenizer: Any, row: dict[str, Any], max_length: int | None,
                     profile: PromptProfile = FULL) -> dict[str, list[int]] | None:
    """input_ids + boundary labels of one verdict row; None when the verify prompt is longer
    than max_length (cutting it would score a prefix the runtime never shows the model)."""
    out = {**token_labels(tokenizer, row, profile), "task_id": str(row["task_id"])}
    return out if max_length is None or len(out["input_ids"]) <= max_length else None


def boundary_dataset(tokenizer: Any, rows: Any, max_length: int | None, profile: PromptProfile = FULL) -> Any:
    """A `verdict` split -> a dataset of input_ids and int64 labels (0/1 at boundaries, -100 elsewhere),
    and the task of each row (what a calibration on it was calibrated on)."""
    from datasets import Dataset, Features, List, Value

    examples = [e for e in (boundary_example(tokenizer, r, max_length, profile) for r in rows) if e is not None]
    if len(examples) < len(rows):
        print(f"verdict: {len(rows) - len(examples)} of {len(rows)} rows dropped: longer than "
              f"max_length={max_length} tokens")
    features = Features({"input_ids": List(Value("int64")), "labels": List(Value("int64")),
                         "act_labels": List(Value("int64")), "task_id": Value("string")})
    return Dataset.from_dict({k: [e[k] for e in examples] for k in features}, features=features)


class BoundaryCollator:
    """Pads input_ids (pad id), attention_mask (0) and labels (-100) to the longest example.

    Labels are built as int64 from the start: a bool tensor or a bool-typed dataset
    column would turn -100 into True (= 1, "valid") at every ignored position, so bool
    labels and any value other than -100/0/1 are refused.
    """

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import torch

        width = max(len(f["input_ids"]) for f in features)
        input_ids = torch.full((len(features), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(features), width), dtype=torch.long)
        labels = torch.full((len(features), width), IGNORE, dtype=torch.long)
        act = torch.full((len(features), width), IGNORE, dtype=torch.long)
        for row, feature in enumerate(features):
            ids, labs = feature["input_ids"], self.checked_labels(feature["labels"])
            if len(labs) != len(ids):
                raise ValueError(f"verdict example {row}: {len(labs)} labels for {len(ids)} tokens")
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention[row, : len(ids)] = 1
            labels[row, : len(ids)] = labs
            if "act_labels" in feature:
                act[row, : len(ids)] = torch.as_tensor(feature["act_labels"], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention, "labels": labels, "act_labels": act}

    @staticmethod
    def checked_labels(labels: Any) -> Any:
        import torch

        tensor = torch.as_tensor(labels)
        if tensor.dtype == torch.bool:
            raise TypeError("verdict labels are bool: -100 (ignore) would read as True; give int labels "
                            "(0/1 at step boundaries, -100 elsewhere)")
        if tensor.is_floating_point() or not bool(((tensor == IGNORE) | (tensor == 0) | (tensor == 1)).all()):
            raise ValueError(f"verdict labels must be the ints -100, 0 or 1; got {sorted(set(tensor.tolist()))[:5]}")
        return tensor.long()


# --------------------------------------------------------------------- head model and trainer


MASS_WEIGHT = 1.0  # weight of -log(P(yes) + P(no)) at the boundaries: vLLM reports top-k only


def boundary_logprobs(model: Any, batch: dict[str, Any], candidates: tuple[int, int],
                      with_act: bool = False) -> tuple[Any, ...]:
    """(log-probs of the (yes, no) tokens at every boundary of the batch [n, 2], their labels [n]),
    and with ``with_act`` the causal-LM loss on the `act_labels` tokens (mean, 0 where none).
    Only the positions needed go through the LM head (`logits_to_keep`): the boundaries, and
    the position before each act token."""
    import torch
    import torch.nn.functional as F

    labels = batch["labels"]
    rows, positions = (labels != IGNORE).nonzero(as_tuple=True)
    act = batch.get("act_labels")
    act_rows, act_next = (act != IGNORE).nonzero(as_tuple=True) if with_act and act is not None else (rows[:0], rows[:0])
    act_rows, act_next = act_rows[act_next > 0], act_next[act_next > 0]  # a first token has no position before it
    keep = torch.unique(torch.cat([positions, act_next - 1]))  # sorted
    device = next(model.parameters()).device
    logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                   logits_to_keep=keep.to(device)).logits
    columns = torch.searchsorted(keep, positions).to(device)
    picked = torch.log_softmax(logits[rows.to(device), columns].float(), dim=-1)[:, list(candidates)]
    if not with_act:
        return picked, labels[rows, positions].to(device)
    if act_rows.numel() == 0:
        return picked, labels[rows, positions].to(device), logits.sum() * 0.0
    before = torch.searchsorted(keep, act_next - 1).to(device)
    lm = F.cross_entropy(logits[act_rows.to(device), before].float(), act[act_rows, act_next].to(device))
    return picked, labels[rows, positions].to(device), lm


def boundary_loss(logprobs: Any, labels: Any) -> Any:
    """BCE of sigmoid(logit[yes] - logit[no]) at the boundaries, plus the mass term."""
    import torch.nn.functional as F

    if logprobs.numel() == 0:
        return logprobs.sum() * 0.0
    margin = logprobs[:, 0] - logprobs[:, 1]
    mass = -logprobs.logsumexp(dim=-1).mean()
    return F.binary_cross_entropy_with_logits(margin, labels.float()) + MASS_WEIGHT * mass


def head_model(cfg: VerdictTrainConfig, model: Any = None) -> Any:
    """The strong model (causal LM) with LoRA; the head is read from its yes/no logits."""
    from peft import get_peft_model

    if model is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir(cfg.model, cfg.gguf_file), dtype=cfg.dtype)
    return get_peft_model(model, lora_config(cfg.lora, "CAUSAL_LM"))


def _verdict_trainer_class():
    from transformers import Trainer

    class VerdictTrainer(Trainer):
        """A Trainer whose loss is `boundary_loss` (mean over the micro-batch's boundaries)."""

        def __init__(self, *args, candidates: tuple[int, int], act_loss_weight: float = 0.0, **kwargs):
            super().__init__(*args, **kwargs)
            self.candidates = candidates
            self.act_loss_weight = act_loss_weight
            self.model_accepts_loss_kwargs = False  # the loss is a per-batch mean: the Trainer scales for GA

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.act_loss_weight > 0:  # judge, and keep acting as the strong model did
                logprobs, labels, lm = boundary_logprobs(model, inputs, self.candidates, with_act=True)
                loss = boundary_loss(logprobs, labels) + self.act_loss_weight * lm
            else:
                logprobs, labels = boundary_logprobs(model, inputs, self.candidates)
                loss = boundary_loss(logprobs, labels)
            return (loss, logprobs) if return_outputs else loss

    return VerdictTrainer


def head_trainer(cfg: VerdictTrainConfig, model: Any = None, tokenizer: Any = None) -> tuple[Any, Any]:
    """(Trainer, validation boundary dataset or None) for a verdict head."""
    from transformers import TrainingArguments

    path = None if model is not None and tokenizer is not None else model_dir(cfg.model, cfg.gguf_file)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path)
    profile = PromptProfile.load(path)  # the strong model's: the verify prompts are rendered as it is served
    train_rows, validation_rows = load_splits(cfg.dataset, cfg.limit)
    train = boundary_dataset(tokenizer, train_rows, cfg.max_length, profile)
    if len(train) == 0:
        raise ConfigError(f"dataset: no usable verdict rows in {cfg.dataset} (max_length={cfg.max_length})")
    validation = (boundary_dataset(tokenizer, validation_rows, cfg.max_length, profile)
                  if validation_rows is not None else None)
    args = TrainingArguments(**{"remove_unused_columns": False, "label_names": ["labels"],
                                **training_kwargs(cfg.train, cfg.output_dir)})
    trainer = _verdict_trainer_class()(
        model=head_model(cfg, model), args=args, train_dataset=train, candidates=HeadSpec().token_ids(tokenizer),
        data_collator=BoundaryCollator(tokenizer.pad_token_id), act_loss_weight=cfg.act_loss_weight,
        processing_class=tokenizer, callbacks=[JsonlLog(Path(cfg.output_dir) / "log.jsonl")],
    )
    trainer.prompt_profile = profile  # saved beside the head (save_verdict)
    return trainer, validation


def score_boundaries(model: Any, dataset: Any, collator: BoundaryCollator, candidates: tuple[int, int],
                     batch_size: int = 1) -> tuple[list[list[float]], list[list[int]]]:
    """P(valid | prefix) at every boundary of every example (one forward pass each), with the labels."""
    import torch

    scores, labels = [], []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(dataset), batch_size):
                for i in range(start, min(start + batch_size, len(dataset))):
                    batch = collator([dataset[i]])
                    logprobs, labs = boundary_logprobs(model, batch, candidates)
                    scores.append([probability(y, n) for y, n in logprobs.tolist()])
                    labels.append(labs.tolist())
    finally:
        model.train(was_training)
    return scores, labels


def evaluate_head(cfg: VerdictTrainConfig, trainer: Any, validation: Any) -> dict[str, Any]:
    """Validation figures at DEFAULT_THRESHOLD (0.5) and at the threshold calibrated for `target_false_accept`.
    (Calibrating and reporting on the same split is optimistic; the calibrated threshold
    is what the runtime should use, and a fresh split should confirm it.)"""
    if validation is None or len(validation) == 0:
        return {"validation": None, "threshold": DEFAULT_THRESHOLD}
    rows = validation.select(range(min(cfg.eval_limit or len(validation), len(validation))))
    scores, labels = score_boundaries(trainer.model, rows, trainer.data_collator, trainer.candidates,
                                      cfg.train.batch_size)
    threshold = calibrate(scores, labels, cfg.target_false_accept)
    calibrated = head_metrics(scores, labels, threshold)
    return {"threshold": threshold, "at_0.5": head_metrics(scores, labels, DEFAULT_THRESHOLD),
            "calibrated": calibrated, "target_false_accept": cfg.target_false_accept,
            "calibration_tasks": sorted(set(rows["task_id"])), "degenerate": calibrated["degenerate"]}


# --------------------------------------------------------------------- generative verdict


def generative_trainer(cfg: VerdictTrainConfig, model: Any = None, tokenizer: Any = None) -> tuple[Any, Any]:
    """(SFTTrainer on prompt/completion + tools, validation rows or None)."""
    from trl import SFTConfig, SFTTrainer

    path = None if model is not None and tokenizer is not None else model_dir(cfg.model, cfg.gguf_file)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path)
    if model is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=cfg.dtype)
    if PromptProfile.load(path) != FULL:
        raise ConfigError(f"model: {cfg.model} is served with the {PromptProfile.load(path).name!r} prompt profile; "
                          "a generative verdict is trained on full prompts only (train a head instead)")
    train, validation = load_splits(cfg.dataset, cfg.limit)
    columns = ["prompt", "completion", "tools"]
    # the completion's tokens only (the verdict and its <|im_end|>): completion mask AND assistant mask
    args = SFTConfig(**{"assistant_only_loss": True, "completion_only_loss": True, "max_length": cfg.max_length,
                        **training_kwargs(cfg.train, cfg.output_dir)})
    trainer = SFTTrainer(model=model, args=args, train_dataset=train.select_columns(columns),
                         processing_class=tokenizer, peft_config=lora_config(cfg.lora, "CAUSAL_LM"),
                         callbacks=[JsonlLog(Path(cfg.output_dir) / "log.jsonl")])
    trainer.prompt_profile = FULL
    return trainer, validation


def evaluate_generative(cfg: VerdictTrainConfig, trainer: Any, validation: Any) -> dict[str, Any]:
    """Decode the verdict on validation verify prompts, parse it as the runtime does, and score it."""
    if validation is None or len(validation) == 0:
        return {"validation": None}
    from specagent.core.interfaces import ChatRequest
    from specagent.core.verify import parse_verdict
    from specagent.engines.transformers_engine import TransformersEngine

    rows = validation.select(range(min(cfg.eval_limit or len(validation), len(validation))))
    model = trainer.model
    was_training = model.training
    engine = TransformersEngine.from_model(model, trainer.processing_class, max_model_len=10**9,
                                           batch_size=cfg.train.batch_size, threads=cfg.train.threads)
    try:
        rows = [VerdictRow.parse(r, f"verdict row {r.get('segment_id')}") for r in rows]
        requests = [ChatRequest(r.prompt_chat(), r.tool_specs(), cfg.eval_max_tokens) for r in rows]
        completions = engine.chat(requests)
    finally:
        model.train(was_training)
    predicted = [0 if c.message.tool_calls else (parse_verdict(c.text, len(r.labels)) or 0)
                 for c, r in zip(completions, rows)]
    decoded = sum(c.usage.completion_tokens for c in completions) / len(completions)
    return {"validation": {**prefix_metrics(predicted, [r.labels for r in rows]), "auroc": None,
                           "decoded_tokens_per_verdict": decoded}}


# --------------------------------------------------------------------- the recipe


def train_verdict(cfg: VerdictTrainConfig, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Train (resuming if asked), evaluate on the validation split, save the adapter. Returns the metrics."""
    set_threads(cfg.train.threads)
    if cfg.kind == "likelihood":  # no weights trained: a logistic fit over the strong model's likelihoods
        from specagent.train.likelihood_head import train_likelihood_head

        check_training(cfg, dataset_dirs=[cfg.dataset])
        return train_likelihood_head(cfg)
    checkpoint = check_training(cfg, dataset_dirs=[cfg.dataset])
    build = head_trainer if cfg.kind == "head" else generative_trainer
    trainer, validation = build(cfg, model, tokenizer)
    if is_main_process():  # the run files once everything loaded
        write_run_info(cfg.output_dir, cfg)
    if checkpoint:
        print(f"resuming from {checkpoint}")
    result = trainer.train(resume_from_checkpoint=checkpoint)
    evaluation = (evaluate_head if cfg.kind == "head" else evaluate_generative)(cfg, trainer, validation)
    return save_verdict(cfg, trainer, {**result.metrics, "global_step": trainer.state.global_step, **evaluation})


def save_verdict(cfg: VerdictTrainConfig, trainer: Any, metrics: dict[str, Any]) -> dict[str, Any]:
    out = Path(cfg.output_dir)
    trainer.save_model(str(out / "adapter"))
    if trainer.is_world_process_zero():
        trainer.processing_class.save_pretrained(str(out / "adapter"))
        trainer.prompt_profile.save(out / "adapter")
        if cfg.kind == "head":
            HeadSpec(threshold=metrics.get("threshold", DEFAULT_THRESHOLD), base_model=cfg.model,
                     calibration_tasks=tuple(metrics.get("calibration_tasks", ())),
                     degenerate=bool(metrics.get("degenerate", False))).save(
                out / "adapter", gguf_file=cfg.gguf_file, target_false_accept=cfg.target_false_accept)
        else:
            (out / "adapter" / "verdict.json").write_text(json.dumps(
                {"kind": "generative", "base_model": cfg.model, "gguf_file": cfg.gguf_file}, indent=2))
        (out / "metrics.json").write_text(json.dumps({**metrics, "peak_rss_gib": peak_rss_gib()}, indent=2))
        print(f"adapter: {out / 'adapter'}   metrics: {out / 'metrics.json'}")
        summary = metrics.get("calibrated") or metrics.get("validation")
        if summary:
            print("validation: " + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in summary.items()))
    return metrics
