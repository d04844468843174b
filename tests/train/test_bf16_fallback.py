"""bf16 on a CPU without native bf16 (AVX2 only) trains in float32, with a warning: there
autocast emulates every matmul (measured here: a 512x576x1536 matmul 12 ms in float32,
720 ms in bf16; a quickstart training step 12.5 min instead of ~15 s)."""

from __future__ import annotations

import pytest

from specagent.config import OptimSettings
from specagent.train import common


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(common, "_has_accelerator", lambda: False)


def test_bf16_on_a_cpu_without_native_bf16_trains_in_float32_and_says_so(on_cpu, monkeypatch):
    monkeypatch.setattr(common, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="no native bf16"):
        kwargs = common.training_kwargs(OptimSettings(bf16=True), "out")
    assert kwargs["bf16"] is False and "use_cpu" not in kwargs


def test_bf16_on_a_cpu_with_native_bf16_autocasts(on_cpu, monkeypatch, recwarn):
    monkeypatch.setattr(common, "cpu_has_native_bf16", lambda: True)
    kwargs = common.training_kwargs(OptimSettings(bf16=True), "out")
    assert kwargs["bf16"] is True and kwargs["use_cpu"] is True
    assert not [w for w in recwarn if "bf16" in str(w.message)]


def test_the_check_reads_this_cpu():
    assert isinstance(common.cpu_has_native_bf16(), bool)
