"""Start and stop a local vLLM OpenAI-compatible server (tests, the edge–cloud split).

The server gets specagent's chat template and the hermes tool parser, so it renders
tools exactly as the offline engines do and returns structured ``tool_calls``
(DESIGN §5). It runs in its own process group so that stopping it also ends the
engine-core and worker processes vLLM forks.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

from specagent.core.errors import EngineError
from specagent.engines.render import template_path
from specagent.engines.vllm_start import KVCachePlan, cpu_server_args, log_cause, on_cpu, start_error

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def server_command(
    model_dir: str,
    port: int,
    adapters: Mapping[str, str] | None = None,
    served_model_name: str | None = None,
    max_model_len: int = 2048,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of a vLLM server that speaks specagent's prompt format."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", HOST,
        "--port", str(port),
        "--chat-template", str(template_path()),
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--max-model-len", str(max_model_len),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
    ]  # fmt: skip
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if adapters:
        cmd += ["--enable-lora", "--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
        if "--max-loras" not in extra_args:
            # A slot that stays empty: vLLM-CPU applies the last slot's adapter to base-model
            # rows of a mixed batch once every slot is occupied (see vllm_engine.VLLMEngine).
            cmd += ["--max-loras", str(len(adapters) + 1)]
    return cmd + list(extra_args)


class ServerHandle:
    """A running vLLM server. Use as a context manager, or call ``stop()``."""

    def __init__(self, process: subprocess.Popen, port: int, model: str, log_path: Path,
                 kv_cache: KVCachePlan | None = None) -> None:
        self.process = process
        self.port = port
        self.model = model  # the name to send as "model" in requests
        self.log_path = log_path
        self.kv_cache = kv_cache  # the CPU KV cache it was started with (None: vLLM's choice, GPU)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the whole process group; SIGKILL it if it has not exited in time."""
        if self.process.poll() is not None:
            return
        _signal_group(self.process, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.process, signal.SIGKILL)
            self.process.wait(timeout=10)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # start_new_session=True: the group id is the pid
    except ProcessLookupError:
        pass


def healthy(base_url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout_s) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_server(
    model_dir: str,
    port: int | None = None,
    adapters: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 300.0,
    served_model_name: str | None = None,
    max_model_len: int = 2048,
    log_path: str | Path | None = None,
) -> ServerHandle:
    """Launch a vLLM server on 127.0.0.1 and wait until /health answers.

    ``model_dir`` is a checkpoint dir or hub id (see ``models.materialize`` for GGUF
    files); ``adapters`` maps LoRA names (the ``model`` of a request) to adapter dirs;
    ``env`` is added to the environment. On vLLM's CPU platform the KV cache is sized
    from the server's needs (``--kv-cache-memory-bytes``, `vllm_start`) unless the
    environment or ``extra_args`` choose it. The server's output goes to ``log_path`` (a
    temp file by default). Raises ``EngineError`` in one line (the cause from the log,
    what to set, the log's path) if the server exits or is not healthy within ``timeout_s``.
    """
    port = port or free_port()
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"vllm-server-{port}-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    full_env = {**os.environ, **(env or {})}
    kv_cache = None
    if on_cpu():
        extra_args, kv_cache = cpu_server_args(str(model_dir), max_model_len, extra_args, full_env,
                                               model_name=served_model_name)
    cmd = server_command(model_dir, port, adapters, served_model_name, max_model_len, extra_args)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, start_new_session=True,
        )  # fmt: skip
    handle = ServerHandle(process, port, served_model_name or str(model_dir), log_path, kv_cache)
    try:
        _wait_healthy(handle, timeout_s)
    except BaseException:
        handle.stop(timeout_s=10)
        raise
    return handle


def _wait_healthy(handle: ServerHandle, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not handle.alive():
            raise exit_error(handle)
        if healthy(handle.base_url):
            return
        time.sleep(1.0)
    raise EngineError(
        f"vLLM server on {handle.base_url} was not healthy after {timeout_s:.0f}s; raise timeout_s if the "
        f"machine is slow (log: {handle.log_path})"
    )


def exit_error(handle: ServerHandle) -> EngineError:
    """One line for a server that exited while starting: the root error from its log, what to
    set, and where the whole log is."""
    try:
        log = handle.log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        log = ""
    cause = log_cause(log) or (handle.log_tail(1).strip() or "no output")
    if handle.process.returncode in (-9, 137):
        cause += " (killed by SIGKILL: out of memory?)"
    why = RuntimeError(f"vLLM server exited with code {handle.process.returncode} while starting")
    error = start_error(why, handle.model, handle.kv_cache, cause=f"exited with code {handle.process.returncode}: {cause}")
    return EngineError(f"{error} (log: {handle.log_path})")
