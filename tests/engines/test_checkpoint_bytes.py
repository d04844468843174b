"""The memory-traffic estimate of a vLLM engine follows the checkpoint's stored dtypes: float
weights at the engine's dtype (vLLM casts them), a quantized checkpoint's int8 weights at one
byte each, a tied LM head once."""

from __future__ import annotations

import types

import pytest
import torch
from safetensors.torch import save_file

from specagent.core.errors import EngineError
from specagent.engines.vllm_engine import checkpoint_bytes, count_parameters


def checkpoint(tmp_path, tensors: dict[str, torch.Tensor]):
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return str(tmp_path)


def test_float_weights_count_at_the_engine_dtype_and_a_tied_head_once(tmp_path):
    d = checkpoint(tmp_path, {"model.embed_tokens.weight": torch.zeros(10, 4),
                              "lm_head.weight": torch.zeros(10, 4),
                              "model.layers.0.mlp.up_proj.weight": torch.zeros(8, 4, dtype=torch.bfloat16)})
    tied, untied = types.SimpleNamespace(tie_word_embeddings=True), types.SimpleNamespace(tie_word_embeddings=False)
    assert count_parameters(d, tied) == 40 + 32
    assert checkpoint_bytes(d, tied, 2) == 2 * (40 + 32)
    assert checkpoint_bytes(d, untied, 4) == 4 * (40 + 40 + 32)


def test_quantized_weights_count_as_stored(tmp_path):
    # a compressed-tensors W8A8 layer: int8 weight, a float scale per output channel
    d = checkpoint(tmp_path, {"model.embed_tokens.weight": torch.zeros(10, 4, dtype=torch.bfloat16),
                              "model.layers.0.mlp.up_proj.weight": torch.zeros(8, 4, dtype=torch.int8),
                              "model.layers.0.mlp.up_proj.weight_scale": torch.zeros(8, 1)})
    cfg = types.SimpleNamespace(tie_word_embeddings=True)
    assert checkpoint_bytes(d, cfg, 2) == 2 * 40 + 1 * 32 + 2 * 8
    assert checkpoint_bytes(d, cfg, 2) < 2 * count_parameters(d, cfg)


def test_an_unknown_dtype_is_an_error_not_a_guess(tmp_path):
    d = checkpoint(tmp_path, {"w": torch.zeros(2, 2, dtype=torch.complex64)})
    with pytest.raises(EngineError, match="dtype"):
        checkpoint_bytes(d, types.SimpleNamespace(), 2)
