"""Starting vLLM on a CPU without the user setting anything (specagent/engines/vllm_start.py):
the KV cache size each shipped config gets, the user's own choice kept, and a start that
fails reported in one line with what to set. No vLLM engine is started here."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from specagent.core.errors import EngineError
from specagent.engines import vllm_server, vllm_start
from specagent.engines.vllm_start import (
    ARG,
    ENV,
    GiB,
    MiB,
    cpu_engine_kwargs,
    cpu_server_args,
    kv_bytes_per_token,
    kv_cache_bytes,
    log_cause,
    plan_kv_cache,
    start_error,
)

ROOT = Path(__file__).resolve().parents[2]
# SmolLM2-135M-Instruct's config.json as the GGUF dequantizes it (float32: vLLM-CPU runs it in bf16)
SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "hidden_size": 576, "dtype": "float32", "max_position_embeddings": 8192}
MACHINE = (24 * GiB, 20 * GiB)  # (total, available): the 24 GiB machine the quickstart must start on
PER_TOKEN = 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, bf16


@pytest.fixture
def smollm2_dir(tmp_path) -> str:
    """A checkpoint dir with SmolLM2's config.json and no weights (nothing here loads them)."""
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return str(tmp_path)


def vllm_roles():
    """(config file, role, engine config) of every shipped role on the vllm backend."""
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        stack = [data]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                for key, value in node.items():
                    if isinstance(value, dict) and value.get("backend") == "vllm":
                        yield path.relative_to(ROOT), key, value
                    stack.append(value)
            elif isinstance(node, list):
                stack.extend(node)


# --- the sizing rule ------------------------------------------------------------------------


def test_kv_bytes_per_token_at_the_dtype_vllm_runs():
    assert kv_bytes_per_token(SMOLLM2) == PER_TOKEN == 23_040  # the float32 checkpoint runs in bf16
    assert kv_bytes_per_token(SMOLLM2, dtype="float32") == 2 * PER_TOKEN
    assert kv_bytes_per_token(SMOLLM2, dtype="float32", kv_cache_dtype="fp8") == PER_TOKEN // 2
    assert kv_bytes_per_token({"text_config": SMOLLM2}) == PER_TOKEN  # multimodal configs nest it
    no_head_dim = {k: v for k, v in SMOLLM2.items() if k != "head_dim"}
    assert kv_bytes_per_token(no_head_dim) == PER_TOKEN  # hidden_size / heads


def test_sizing_rule_needs_headroom_cap_and_floor():
    # vLLM-CPU's default 256 sequences of 4,096 tokens would be 22.5 GiB: the cap decides
    assert kv_cache_bytes(4096, 256, PER_TOKEN, 24 * GiB) == 2 * GiB
    assert kv_cache_bytes(4096, 256, PER_TOKEN, 8 * GiB) == 1 * GiB  # 1/8 of a smaller machine
    # few sequences: what they need, x1.25, in whole MiB
    assert kv_cache_bytes(4096, 4, PER_TOKEN, 24 * GiB) == 4 * 4096 * PER_TOKEN * 5 // 4 == 450 * MiB
    # a tiny machine still gets one full-length request (+2 blocks, x1.25), or vLLM would refuse
    floor = kv_cache_bytes(8192, 256, PER_TOKEN, 1 * GiB)
    assert floor == 233 * MiB > (1 * GiB) // 8 and floor >= vllm_start.one_request_bytes(8192, PER_TOKEN)


def test_every_shipped_cpu_config_gets_an_explicit_cache_that_fits_a_24_gib_machine():
    cpu, gpu = [], []
    for path, role, engine in vllm_roles():
        kwargs = engine.get("engine_kwargs") or {}
        if "gpu_memory_utilization" in kwargs or "tensor_parallel_size" in kwargs:
            gpu.append(path)  # GPU configs: vLLM sizes their cache, specagent leaves them alone
            continue
        cpu.append((str(path), role))
        # SmolLM2, or a SmolLM2 trained on this CPU and exported under runs/ (a merged strong model)
        assert engine["model"] == "smollm2" or engine["model"].startswith("runs/"), (path, role)
        plan = plan_kv_cache(engine["model"], engine["max_model_len"], kwargs, {}, MACHINE[0], config=SMOLLM2)
        assert (plan.source, plan.bytes) == ("sized", 2 * GiB), (path, role, plan)
        assert plan.min_bytes < plan.bytes < MACHINE[1]  # one request fits; vLLM's free-memory check passes
        assert "max_num_seqs 256" in plan.detail
        # as `specagent serve`/`eval` would pass it: explicit bytes, so vLLM never asks for 0.92 x RAM
        engine_kwargs = {"model": "m", "max_model_len": engine["max_model_len"], **kwargs}
        assert plan_kv_cache("m", engine["max_model_len"], engine_kwargs, {}, MACHINE[0], config=SMOLLM2) == plan
    assert ("configs/quickstart/eval.yaml", "weak") in cpu  # an arm's own weak model (the drafter) too
    assert {p for p, _ in cpu} >= {"configs/eval/store_smollm2_vllm.yaml", "configs/run/airline_smollm2_vllm.yaml",
                                   "configs/serve/store_smollm2_vllm.yaml", "configs/mine/airline_smollm2_live.yaml"}
    assert {str(p) for p in gpu} == {"configs/eval/gpu_qwen.yaml", "configs/run/gpu_qwen_vllm.yaml",
                                     "configs/eval/gpu_qwen_ray.yaml", "configs/mine/gpu_qwen_ray.yaml"}


# --- the user's choice is kept ----------------------------------------------------------------


def test_an_unset_variable_gets_set_and_a_user_set_one_is_kept(smollm2_dir):
    kwargs = {"model": smollm2_dir, "max_model_len": 4096, "enforce_eager": True}
    sized, plan = cpu_engine_kwargs(kwargs, "smollm2", environ={}, memory=MACHINE)
    assert sized[ARG] == plan.bytes == 2 * GiB and plan.source == "sized"
    assert ARG not in kwargs  # the caller's dict is not changed
    assert cpu_engine_kwargs(kwargs, "smollm2", environ={ENV: ""}, memory=MACHINE)[0][ARG] == 2 * GiB  # "" is unset

    kept, plan = cpu_engine_kwargs(kwargs, "smollm2", environ={ENV: "3"}, memory=MACHINE)
    assert ARG not in kept and (plan.source, plan.bytes) == (ENV, 3 * GiB)  # vLLM reads the variable itself
    kept, plan = cpu_engine_kwargs({**kwargs, ARG: 300 * MiB}, "smollm2", environ={}, memory=MACHINE)
    assert kept[ARG] == 300 * MiB and plan.source == ARG
    kept, plan = cpu_engine_kwargs({**kwargs, "gpu_memory_utilization": 0.3}, "smollm2", environ={}, memory=MACHINE)
    assert ARG not in kept and plan.source == "gpu_memory_utilization"
    few, plan = cpu_engine_kwargs({**kwargs, "max_num_seqs": 4}, "smollm2", environ={}, memory=MACHINE)
    assert few[ARG] == 450 * MiB  # the engine's own needs, when they are under the cap
    with pytest.raises(EngineError, match=f"{ENV}='two' is not a whole number of GiB"):
        cpu_engine_kwargs(kwargs, "smollm2", environ={ENV: "two"}, memory=MACHINE)


def test_server_flags_get_the_size_unless_the_user_chose_one(smollm2_dir):
    args, plan = cpu_server_args(smollm2_dir, 4096, ["--enforce-eager"], {}, memory=MACHINE)
    assert args == ["--enforce-eager", "--kv-cache-memory-bytes", str(2 * GiB)] and "max_num_seqs 128" in plan.detail
    assert cpu_server_args(smollm2_dir, 4096, [], {ENV: "1"}, memory=MACHINE)[0] == []
    args, plan = cpu_server_args(smollm2_dir, 4096, ["--kv-cache-memory-bytes=1G"], {}, memory=MACHINE)
    assert args == ["--kv-cache-memory-bytes=1G"] and plan.bytes == GiB  # vLLM's "1G": binary
    args, plan = cpu_server_args(smollm2_dir, 4096, ["--kv-cache-memory-bytes", "900m"], {}, memory=MACHINE)
    assert "--kv-cache-memory-bytes" not in args[2:] and plan.bytes == 900 * 10**6  # lower case: decimal
    args, _ = cpu_server_args(smollm2_dir, 4096, ["--max-num-seqs", "4"], {}, memory=MACHINE)
    assert args[-2:] == ["--kv-cache-memory-bytes", str(450 * MiB)]


class FakeProcess:
    pid, returncode = 0, None

    def poll(self):
        return 0


def test_start_server_sizes_the_cache_and_keeps_the_users_environment(smollm2_dir, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(vllm_server.subprocess, "Popen", lambda cmd, env, **kw: started.append((cmd, env)) or FakeProcess())
    monkeypatch.setattr(vllm_server, "_wait_healthy", lambda handle, timeout_s: None)
    monkeypatch.setattr(vllm_server, "on_cpu", lambda: True)
    monkeypatch.setattr(vllm_start, "memory_status", lambda: MACHINE)
    monkeypatch.delenv(ENV, raising=False)

    handle = vllm_server.start_server(smollm2_dir, port=1, log_path=tmp_path / "a.log")
    cmd, env = started[-1]
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(2 * GiB) and ENV not in env
    assert handle.kv_cache.bytes == 2 * GiB

    monkeypatch.setenv(ENV, "5")  # the user's choice reaches the server unchanged
    vllm_server.start_server(smollm2_dir, port=1, log_path=tmp_path / "b.log")
    cmd, env = started[-1]
    assert "--kv-cache-memory-bytes" not in cmd and env[ENV] == "5"

    monkeypatch.setattr(vllm_server, "on_cpu", lambda: False)  # GPU: vLLM's own sizing
    monkeypatch.delenv(ENV)
    vllm_server.start_server(smollm2_dir, port=1, log_path=tmp_path / "c.log")
    assert "--kv-cache-memory-bytes" not in started[-1][0]


# --- a start that fails says why, in one line -------------------------------------------------


def test_a_cache_that_cannot_fit_is_refused_before_vllm_starts(smollm2_dir):
    kwargs = {"model": smollm2_dir, "max_model_len": 4096}
    with pytest.raises(EngineError) as err:
        cpu_engine_kwargs(kwargs, "smollm2", environ={}, memory=(24 * GiB, GiB))
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert "2.00 GiB" in message and "only 1.00 of 24.0 GiB is available" in message
    assert f"{ENV}=<GiB>" in message and f"engine_kwargs.{ARG}=<bytes>" in message
    with pytest.raises(EngineError, match="cannot hold one request of max_model_len"):
        cpu_engine_kwargs(kwargs, "smollm2", environ={ENV: "0"}, memory=MACHINE)
    with pytest.raises(EngineError, match="lower gpu_memory_utilization"):  # vLLM's default fraction, spelled out
        cpu_engine_kwargs({**kwargs, "gpu_memory_utilization": 0.92}, "smollm2", environ={}, memory=(24 * GiB, 20 * GiB))


ENGINE_CORE_FAILED = RuntimeError("Engine core initialization failed. See root cause above. "
                                  "Failed core proc(s): {'EngineCore_DP0': 1}")
NO_MEMORY = ValueError("Available memory on node 0 (1.00/23.54 GiB) on kv cache allocation is less than requested "
                       "memory for kv (2.00 GiB).\nDecrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or "
                       "reduce CPU memory used by other processes.")


def test_start_errors_are_one_line_with_the_cause_and_what_to_set():
    plan = plan_kv_cache("m", 4096, {}, {}, 24 * GiB, config=SMOLLM2)
    for exc, cause in [(ENGINE_CORE_FAILED, "vLLM's engine process exited while starting"),
                       (NO_MEMORY, "Available memory on node 0 (1.00/23.54 GiB)")]:
        message = str(start_error(exc, "smollm2", plan))
        assert len(message.splitlines()) == 1, message
        assert message.startswith("smollm2: the vLLM engine did not start: ") and cause in message
        assert "its KV cache was 2.00 GiB" in message
        assert f"{ENV}=<GiB> or engine_kwargs.{ARG}=<bytes>" in message
    other = str(start_error(TypeError("LLM.__init__() got an unexpected keyword argument 'bogus'"), "m", plan))
    assert "'bogus'" in other and "check the model and engine options" in other
    assert "engine options" in str(start_error(ENGINE_CORE_FAILED, "m", None))  # GPU: no CPU plan
    assert str(start_error(ValueError("x" * 1000), "m", plan)).count("x") < 400  # never pages long


def test_vllm_engine_raises_the_one_line_error_and_passed_the_size(smollm2_dir, monkeypatch):
    """VLLMEngine on a fake `vllm` module: the sized cache reaches vllm.LLM; a failed start
    is an EngineError of one line; a cache that cannot fit never reaches vLLM."""
    from specagent.engines import vllm_engine

    seen = []

    def failing_llm(**kwargs):
        seen.append(kwargs)
        raise ENGINE_CORE_FAILED

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=failing_llm))
    monkeypatch.setattr(vllm_engine, "on_cpu", lambda: True)
    monkeypatch.setattr(vllm_start, "memory_status", lambda: MACHINE)
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(EngineError) as err:
        vllm_engine.VLLMEngine(smollm2_dir, model_name="smollm2", max_model_len=4096)
    assert seen[-1][ARG] == 2 * GiB and seen[-1]["max_model_len"] == 4096
    assert len(str(err.value).splitlines()) == 1 and ENV in str(err.value)

    monkeypatch.setattr(vllm_start, "memory_status", lambda: (24 * GiB, GiB // 2))
    with pytest.raises(EngineError, match="is available"):
        vllm_engine.VLLMEngine(smollm2_dir, model_name="smollm2", max_model_len=4096)
    assert len(seen) == 1  # refused before vLLM was asked


SERVER_LOG = """\
INFO 07-01 10:00:00 [api_server.py:1] vLLM API server version 0.32.0
(EngineCore_DP0 pid=4242) ERROR 07-01 10:00:09 [core.py:1] EngineCore failed to start.
(EngineCore_DP0 pid=4242) Traceback (most recent call last):
(EngineCore_DP0 pid=4242)   File "vllm/v1/worker/cpu_worker.py", line 224, in determine_available_memory
(EngineCore_DP0 pid=4242)     raise ValueError(
(EngineCore_DP0 pid=4242) ValueError: Available memory on node 0 (1.00/23.54 GiB) on kv cache allocation is less \
than requested memory for kv (2.00 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU \
memory used by other processes.
Traceback (most recent call last):
  File "vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}
"""


def test_a_server_log_gives_its_root_cause_in_one_line(tmp_path):
    assert log_cause(SERVER_LOG).startswith("ValueError: Available memory on node 0 (1.00/23.54 GiB)")
    validation = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                  "  Value error, Invalid repository ID or local directory specified: '/x/no-model' "
                  "[type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]\n"
                  "    For further information visit https://errors.pydantic.dev/2.11/v/value_error\n")
    assert log_cause(validation) == ("ValidationError: 1 validation error for ModelConfig Value error, Invalid "
                                     "repository ID or local directory specified: '/x/no-model' [type=value_error, "
                                     "input_value=ArgsKwargs(()), input_type=ArgsKwargs]")
    assert log_cause("INFO nothing went wrong\n") is None

    log = tmp_path / "server.log"
    log.write_text(SERVER_LOG)
    process = types.SimpleNamespace(returncode=1, poll=lambda: 1, pid=0)
    plan = plan_kv_cache("m", 4096, {}, {}, 24 * GiB, server=True, config=SMOLLM2)
    message = str(vllm_server.exit_error(vllm_server.ServerHandle(process, 1, "smollm2", log, plan)))
    assert len(message.splitlines()) == 1, message
    assert "exited with code 1: ValueError: Available memory on node 0" in message
    assert f"{ENV}=<GiB> or --kv-cache-memory-bytes=<bytes>" in message and str(log) in message
