"""Edge–cloud end to end: the weak model local (scripted), the strong model behind a real HTTP
server on 127.0.0.1 speaking the OpenAI chat-completions API. What crossed the network is
counted per model and role in the episode records and in the run summary's `network` section,
and must equal what the server itself saw."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specagent.core.metrics import summarize
from specagent.core.protocol import Models, ProtocolConfig
from specagent.core.types import Message
from specagent.core.verify import GenerativeVerifier
from specagent.engines.openai_engine import OpenAIEngine
from specagent.engines.scripted import ScriptedEngine, count_tokens, message_text
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy
from specagent.runtime.episodes import run_tasks

TASKS = ["lookup_01", "single_write_01", "lookups_then_write_01"]
REVIEW = re.compile(r"^REVIEW\..* from 0 to (\d+)")
COUNTS = ("requests", "prompt_tokens", "completion_tokens", "bytes_sent", "bytes_received")
# the same counts as the ledger of an episode record names them, per model and role
LEDGER_KEYS = dict(zip(COUNTS, ("network_requests", "network_prompt_tokens", "network_completion_tokens",
                                "bytes_sent", "bytes_received")))


class CloudExpert:
    """A tiny OpenAI-compatible server whose model is the store's expert: it approves every
    drafted step of a verify prompt and answers any other prompt with the expert's next step.
    Usage is counted as the scripted engine counts it; the server tallies what it saw, named
    from the client's side (``bytes_sent``: what the client sent)."""

    def __init__(self, env: StoreEnv) -> None:
        self.policy = expert_policy(env)
        self.seen = dict.fromkeys(COUNTS, 0)
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                data = json.dumps(cloud.answer(json.loads(raw))).encode()
                # tallied before the reply goes out: once the client has it, the run may end and the
                # test read the tally (tallying after the write raced with that on a loaded machine)
                cloud.tally(requests=1, bytes_sent=len(raw), bytes_received=len(data))  # the client's view
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = [Message.from_openai(m) for m in body["messages"]]
        review = REVIEW.match(messages[-1].content or "")
        step = Message("assistant", review.group(1)) if review else self.policy(messages, ())
        usage = {"prompt_tokens": count_tokens("".join(message_text(m) for m in messages)),
                 "completion_tokens": count_tokens(message_text(step))}
        self.tally(prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"])
        return {"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"], "usage": usage,
                "choices": [{"index": 0, "message": step.to_openai(), "finish_reason": "stop"}]}

    def tally(self, **counts: int) -> None:
        for key, value in counts.items():
            self.seen[key] += value

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "CloudExpert":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def edge_cloud_run(tmp_path_factory):
    """`strong` and `specagent` on the same tasks; per mode, its records and what the server saw."""
    env = StoreEnv()
    out = tmp_path_factory.mktemp("edge-cloud") / "episodes.jsonl"
    seen: dict[str, dict[str, int]] = {}
    with CloudExpert(env) as cloud, OpenAIEngine(cloud.url, "cloud-strong", timeout_s=10) as strong:
        weak = ScriptedEngine(expert_policy(env), model_name="local-weak")
        models = Models(strong=strong, weak=weak, verifier=GenerativeVerifier(strong))
        for mode in ("strong", "specagent"):
            before = dict(cloud.seen)
            run_tasks(env, TASKS, [mode], models, ProtocolConfig(), out)
            seen[mode] = {key: cloud.seen[key] - before[key] for key in COUNTS}
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return records, seen


def test_every_episode_succeeds_across_the_network(edge_cloud_run):
    records, seen = edge_cloud_run
    assert [(r["mode"], r["reward"]) for r in records] == [("strong", 1.0)] * 3 + [("specagent", 1.0)] * 3
    assert all(seen[mode]["requests"] > 0 for mode in seen)


def test_records_count_the_network_per_model_and_role(edge_cloud_run):
    records, seen = edge_cloud_run
    for mode, roles in (("strong", {"act"}), ("specagent", {"verdict"})):  # the expert drafts: no repairs
        mine = [r for r in records if r["mode"] == mode]
        strong = [r["ledger"]["strong"] for r in mine]
        assert all(set(ledger) == roles for ledger in strong)
        totals = {key: sum(role[name] for ledger in strong for role in ledger.values())
                  for key, name in LEDGER_KEYS.items()}
        assert totals == seen[mode]  # the client's count is the server's, byte for byte
        assert all(role["network_requests"] == role["calls"] for ledger in strong for role in ledger.values())
        weak = [role for r in mine for role in r["ledger"].get("weak", {}).values()]
        assert all(role["network_requests"] == role["bytes_sent"] == 0 for role in weak)  # local


def test_summary_network_section_and_the_strong_tokens_it_halves(edge_cloud_run):
    records, seen = edge_cloud_run
    summary = summarize(records)
    for mode in ("strong", "specagent"):
        network = summary[mode]["network"]
        assert network["total"] == seen[mode]
        assert set(network["by_model"]) == {"strong"}  # the weak model is local
        assert network["total"]["completion_tokens"] == summary[mode]["strong_decode_tokens"]
    verdicts = summary["specagent"]["network"]["by_model"]["strong"]["verdict"]
    assert verdicts["requests"] == summary["specagent"]["rounds"]  # one verify request per round
    # the strong model only reads the drafts and answers with a number: far fewer generated tokens
    assert 2 * seen["specagent"]["completion_tokens"] <= seen["strong"]["completion_tokens"]


def test_records_from_before_network_counts_still_summarize(edge_cloud_run):
    records, _ = edge_cloud_run
    old = json.loads(json.dumps(records[0]))
    for roles in old["ledger"].values():
        for stats in roles.values():
            for key in LEDGER_KEYS.values():
                del stats[key]
    summary = summarize([old])[old["mode"]]
    assert summary["network"] == {"total": dict.fromkeys(COUNTS, 0), "by_model": {}}
    assert summary["strong_decode_tokens"] == summarize([records[0]])[old["mode"]]["strong_decode_tokens"] > 0
