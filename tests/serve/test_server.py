"""`specagent serve` as a user runs it: a real subprocess on a free loopback port with the
scripted config; episodes, a chat-completions turn and metrics over HTTP; a clean stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from specagent.engines.vllm_server import free_port
from specagent.envs.store import StoreEnv

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/serve/store_scripted.yaml"
COUNTERS = ("drafted_steps", "accepted_steps", "held_approved", "repairs")


class Served:
    """A `specagent serve` process and an HTTP client for it."""

    def __init__(self, log_path: Path, overrides: tuple[str, ...] = ("modes=[strong,specagent]",)) -> None:
        self.port = free_port()
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "specagent", "serve", "-c", CONFIG, f"port={self.port}", *overrides],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        self._wait_healthy(timeout_s=60)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"serve exited early:\n{self.log_path.read_text()}"
            try:
                if self.http.get("/health").json() == {"status": "ok"}:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"serve was not healthy after {timeout_s}s:\n{self.log_path.read_text()}")

    def metrics(self) -> dict:
        return self.http.get("/metrics", params={"format": "json"}).json()

    def stop(self) -> None:
        self.http.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = Served(tmp_path_factory.mktemp("serve") / "serve.log")
    yield served
    served.stop()


def tokens(snapshot: dict, model: str, role: str) -> dict:
    return snapshot["tokens"].get(model, {}).get(role, {"prefill_new": 0, "prefill_cached": 0, "decode": 0})


def test_an_episode_over_http_is_its_record_and_moves_the_counters(served):
    before = served.metrics()
    record = served.http.post("/v1/episodes", json={"task_id": "lookups_then_write_01"}).json()
    after = served.metrics()
    assert (record["format"], record["task_id"], record["mode"], record["reward"]) == (
        "specagent.episode/v1", "lookups_then_write_01", "specagent", 1.0)
    assert after["episodes"] == before["episodes"] + 1 and after["chat_turns"] == before["chat_turns"]
    for key in COUNTERS:
        assert after[key] == before[key] + record["counts"][key]
    assert record["counts"]["accepted_steps"] > 0 and record["counts"]["held_approved"] > 0
    for model, roles in record["ledger"].items():
        for role, stats in roles.items():
            grew = {k: tokens(after, model, role)[k] - tokens(before, model, role)[k]
                    for k in ("prefill_new", "decode")}
            new = stats["prompt_tokens"] - stats["cached_tokens"]
            assert grew == {"prefill_new": new, "decode": stats["decode_tokens"]}


def test_episode_requests_name_a_known_task_and_mode(served):
    strong = served.http.post("/v1/episodes", json={"task_id": "lookup_01", "mode": "strong"}).json()
    assert strong["mode"] == "strong" and strong["counts"]["drafted_steps"] == 0 and set(strong["ledger"]) == {"strong"}
    missing = served.http.post("/v1/episodes", json={"task_id": "nope"})
    assert missing.status_code == 404 and "'nope'" in missing.json()["error"]["message"]
    assert served.http.post("/v1/episodes", json={"task_id": "lookup_01", "mode": "fast"}).status_code == 422


def test_a_chat_completions_turn_runs_the_protocol_server_side(served):
    task = StoreEnv().task("single_write_01")
    before = served.metrics()
    reply = served.http.post("/v1/chat/completions", json={
        "model": "specagent", "temperature": 0.2, "messages": [{"role": "user", "content": task["request"]}]}).json()
    after = served.metrics()
    assert reply["object"] == "chat.completion" and reply["model"] == "specagent"
    [choice] = reply["choices"]
    assert choice["message"] == {"role": "assistant", "content": task["expert_reply"]}
    assert choice["finish_reason"] == "stop"
    usage = reply["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    ext = reply["specagent"]
    # the lookups ran on the server as they were drafted; the cancellation was held, approved, then run
    assert [(c["name"], c["read_only"]) for c in ext["tool_calls"]] == [
        ("find_user_id_by_email", True), ("get_order_details", True), ("cancel_pending_order", False)]
    assert '"order_id":"W1002"' in ext["tool_calls"][1]["observation"]
    assert '"status":"cancelled"' in ext["tool_calls"][2]["observation"]
    write = [s for s in ext["steps"] if s["kind"] == "write"]
    assert [(s["source"], s["status"]) for s in write] == [("weak", "held_approved")]
    assert (ext["drafted_steps"], ext["accepted_steps"], ext["held_approved"], ext["repairs"]) == (4, 4, 2, 0)
    assert ext["messages"][-1]["content"] == task["expert_reply"]
    assert after["chat_turns"] == before["chat_turns"] + 1 and after["episodes"] == before["episodes"]
    for key in COUNTERS:
        assert after[key] == before[key] + ext[key]


def test_bad_chat_messages_are_refused(served):
    no_role = served.http.post("/v1/chat/completions", json={"messages": [{"content": "hi"}]})
    assert no_role.status_code == 422 and no_role.json()["detail"][0]["loc"] == ["body", "messages", 0, "role"]
    call = {"id": "c1", "type": "function", "function": {"name": "get_order_details", "arguments": "{not json"}}
    messages = [{"role": "assistant", "tool_calls": [call]}]
    bad_call = served.http.post("/v1/chat/completions", json={"messages": messages})
    assert bad_call.status_code == 400 and "tool call" in bad_call.json()["detail"]


def test_prometheus_metrics_match_the_json_counters(served):
    served.http.post("/v1/episodes", json={"task_id": "lookup_01"})
    text = served.http.get("/metrics")
    snapshot = served.metrics()
    assert text.headers["content-type"].startswith("text/plain")
    samples = dict(line.rsplit(" ", 1) for line in text.text.splitlines() if line and not line.startswith("#"))
    for key in ("episodes", "chat_turns", *COUNTERS):
        assert float(samples[f"specagent_{key}_total"]) == snapshot[key]
    decode = 'specagent_tokens_total{model="weak",phase="decode",role="draft"}'
    assert float(samples[decode]) == snapshot["tokens"]["weak"]["draft"]["decode"] > 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_server_cleanly(tmp_path, signum):
    served = Served(tmp_path / "serve.log")
    try:
        assert served.http.post("/v1/episodes", json={"task_id": "lookup_01"}).status_code == 200
        served.process.send_signal(signum)
        assert served.process.wait(timeout=30) == 0, served.log_path.read_text()
    finally:
        served.stop()
    assert "Finished server process" in served.log_path.read_text()
    with socket.socket() as sock:  # nothing listens there: a new server can take the port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: closed connections linger
        sock.bind(("127.0.0.1", served.port))
        sock.listen()


def test_a_config_typo_exits_2_before_serving():
    out = subprocess.run([sys.executable, "-m", "specagent", "serve", "-c", CONFIG, "prot=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "prot: unknown key" in out.stderr and "Traceback" not in out.stderr
