"""bf16 on a CPU without AMX trains in float32, with a warning. With AVX2 only, autocast emulates
every matmul (a 512x576x1536 matmul 12 ms in float32, 720 ms in bf16; a quickstart training step
12.5 min instead of ~15 s). With AVX512-BF16 but no AMX it runs natively and is still slower:
`specagent train drafter -c configs/quickstart/strong.yaml train.max_steps=4` took 51 s in float32
and 90 s with bf16 autocast (2 cores, 2026-12-07)."""

from __future__ import annotations

import pytest

from specagent.config import OptimSettings
from specagent.train import common


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(common, "_has_accelerator", lambda: False)


def test_bf16_on_a_cpu_without_amx_trains_in_float32_and_says_so(on_cpu, monkeypatch):
    monkeypatch.setattr(common, "cpu_bf16_pays", lambda: False)
    with pytest.warns(UserWarning, match="no AMX"):
        kwargs = common.training_kwargs(OptimSettings(bf16=True), "out")
    assert kwargs["bf16"] is False and "use_cpu" not in kwargs


def test_bf16_on_a_cpu_with_amx_autocasts(on_cpu, monkeypatch, recwarn):
    monkeypatch.setattr(common, "cpu_bf16_pays", lambda: True)
    kwargs = common.training_kwargs(OptimSettings(bf16=True), "out")
    assert kwargs["bf16"] is True and kwargs["use_cpu"] is True
    assert not [w for w in recwarn if "bf16" in str(w.message)]


def test_the_check_reads_this_cpu():
    assert isinstance(common.cpu_bf16_pays(), bool)
