"""A full checkpoint -> int8 W8A8 in the compressed-tensors format vLLM serves.

Every Linear layer but the LM head gets int8 weights (symmetric, one scale per output channel,
from the weights' own min and max: no calibration data) and int8 activations quantized per
token at run time. vLLM runs the result with its int8 kernels (oneDNN on x86 CPUs, CUTLASS on
GPUs) and holds about half the bytes of bf16 for those layers; the LM head (tied to the
embeddings in small models) stays in the engine's dtype. The format and the scale arithmetic are
compressed-tensors' (a vLLM dependency): this is what llm-compressor's `QuantizationModifier(
scheme="W8A8", ignore=["lm_head"])` writes, tensor for tensor.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import get_args

from specagent.core.types import Quantization

SCHEMES: tuple[str, ...] = get_args(Quantization)
# files of a model dir the quantized copy keeps as they are (tokenizer, template, prompt profile)
KEPT = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
        "generation_config.json", "prompt_profile.json", "vocab.json", "merges.txt")


def quantize(model_dir: str | Path, out: str | Path, scheme: str = "w8a8") -> Path:
    """Write ``model_dir`` quantized with ``scheme`` to ``out`` (created; must not exist)."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    if scheme not in SCHEMES:
        raise ValueError(f"quantize: scheme {scheme!r} is not one of {', '.join(SCHEMES)}")
    model_dir, out = Path(model_dir), Path(out)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme("W8A8", ["Linear"])},
                                ignore=["lm_head"])
    apply_quantization_config(model, config)
    with torch.no_grad():
        for module in model.modules():
            args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
            if args is None:
                continue
            weight = module.weight.float()
            scale, zero_point = calculate_qparams(weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True),
                                                  args)
            module.weight_scale.copy_(scale.to(module.weight_scale.dtype))
            module.weight_zero_point.copy_(zero_point)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    for name in KEPT:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, out / name)
    return out
