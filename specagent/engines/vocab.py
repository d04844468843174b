"""A drafter with only its domain's vocabulary: fewer rows in its embedding and LM head.

SmolLM2's LM head is 49,152 x 576 weights, 28M of a 10-layer drafter's 64M: every decoded
token reads it, and on a CPU that is most of the drafter's cost per token. A drafter only
ever writes its domain (tool calls, ids, short replies), so it can keep just the tokens
its training rows use. The runtime hands the drafter's steps to the strong model as text
(parsed, then rendered with the strong model's own tokenizer), so the drafter may have a
tokenizer of its own.

What is kept (`kept_ids`): every token of the training rows as rendered for the drafter,
the added (special) tokens, the 256 byte tokens (so any text still encodes), and every
token a kept token is merged from. The pruned BPE keeps the merges whose result is kept,
in their order, which makes it tokenize a kept word exactly as before: each merge BPE
applied to that word produced a kept token or a part of one, so it is still there and still
the first applicable. Text outside the rows falls back to shorter kept pieces.

The model keeps its layers; the embedding (and an untied LM head) keep the kept rows in
their order, so the logits of a kept token are the same dot product as before and the
pruned model's distribution is the full one renormalized over the kept tokens: its
greedy token is the full model's wherever that one is kept.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterable

VOCAB_TENSORS = ("embed_tokens.weight", "lm_head.weight")
ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "decoder_start_token_id")


def byte_alphabet() -> set[str]:
    """The 256 one-character tokens of a byte-level BPE (every byte's printable stand-in)."""
    from tokenizers.pre_tokenizers import ByteLevel

    return set(ByteLevel.alphabet())


def kept_ids(tokenizer_json: dict[str, Any], used_ids: Iterable[int]) -> list[int]:
    """The ids to keep, ascending: `used_ids`, added tokens, bytes, and every merge part."""
    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"vocabulary pruning needs a BPE tokenizer, not {model.get('type')!r}")
    vocab: dict[str, int] = model["vocab"]
    token_of = {i: t for t, i in vocab.items()}
    parts = {}
    for merge in model["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        parts.setdefault(left + right, (left, right))
    keep = {token_of[i] for i in used_ids if i in token_of}
    keep |= {t for t in byte_alphabet() if t in vocab}
    stack = list(keep)
    while stack:  # close under "is merged from"
        for part in parts.get(stack.pop(), ()):
            if part not in keep:
                keep.add(part)
                stack.append(part)
    ids = {vocab[t] for t in keep} | {added["id"] for added in tokenizer_json.get("added_tokens", [])}
    return sorted(ids)


def prune_tokenizer(tokenizer_json: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """The tokenizer with only `keep` (ascending old ids), renumbered 0..len(keep)-1 in order."""
    new_id = {old: new for new, old in enumerate(keep)}
    out = json.loads(json.dumps(tokenizer_json))
    model = out["model"]
    model["vocab"] = {t: new_id[i] for t, i in model["vocab"].items() if i in new_id}
    kept = set(model["vocab"])
    merges = []
    for merge in model["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if left + right in kept:
            merges.append(merge)
    model["merges"] = merges
    for added in out.get("added_tokens", []):
        added["id"] = new_id[added["id"]]
    return out


def used_token_ids(tokenizer: Any, texts: Iterable[str]) -> set[int]:
    ids: set[int] = set()
    for text in texts:
        ids.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


def prune_model_dir(model_dir: str | Path, out: str | Path, texts: Iterable[str]) -> dict[str, Any]:
    """Write `out`: `model_dir` with only the vocabulary `texts` need. Returns the figures.

    `texts` are what the model will read and write (its training rows, rendered)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    model_dir, out = Path(model_dir), Path(out)
    tokenizer_json = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    vocab_size = int(config["vocab_size"])
    keep = [i for i in kept_ids(tokenizer_json, used_token_ids(AutoTokenizer.from_pretrained(str(model_dir)), texts))
            if i < vocab_size]
    new_id = {old: new for new, old in enumerate(keep)}
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model_dir, out, ignore=shutil.ignore_patterns(  # tokenizer.json is rewritten, the rest sliced
        "*.safetensors", "*.bin", "*.safetensors.index.json", "tokenizer.json", "vocab.json", "merges.txt"))
    (out / "tokenizer.json").write_text(json.dumps(prune_tokenizer(tokenizer_json, keep), ensure_ascii=False),
                                        encoding="utf-8")
    index = torch.tensor(keep)
    sliced = []
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{model_dir}: no *.safetensors weights to prune")
    for shard in shards:
        tensors = load_file(str(shard))
        for name, tensor in tensors.items():
            if name.endswith(VOCAB_TENSORS) and tensor.shape[0] == vocab_size:
                tensors[name] = tensor.index_select(0, index).contiguous()
                sliced.append(name)
        save_file(tensors, str(out / shard.name), metadata={"format": "pt"})
    if not sliced:
        raise ValueError(f"{model_dir}: no embedding or LM head of {vocab_size} rows found")
    if (model_dir / "model.safetensors.index.json").exists():
        shutil.copy(model_dir / "model.safetensors.index.json", out)
    for name in ("config.json", "generation_config.json"):
        if (out / name).exists():
            data = json.loads((out / name).read_text(encoding="utf-8"))
            data.update({k: _renumber(data[k], new_id) for k in ID_KEYS if data.get(k) is not None})
            if name == "config.json":
                data["vocab_size"] = len(keep)
            (out / name).write_text(json.dumps(data, indent=2), encoding="utf-8")
    return {"vocab_size": vocab_size, "kept": len(keep), "sliced": sliced}


def _renumber(value: Any, new_id: dict[int, int]) -> Any:
    if isinstance(value, list):
        return [_renumber(v, new_id) for v in value]
    if value not in new_id:
        raise ValueError(f"special token id {value} is not among the kept tokens")
    return new_id[value]
