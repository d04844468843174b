"""BatchingEngine: batches form across threads, each caller gets its own answers, errors
reach the right callers, and a lone caller waits for no window."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from specagent.core.errors import ContextLengthExceeded, EngineUnavailable
from specagent.core.interfaces import ChatRequest, Completion, ModelCost
from specagent.core.types import Message, Usage
from specagent.engines import batching
from specagent.engines.batching import BatchingEngine, CallerGroup, batch_report, batching_engines


class Recorder:
    """Answers "re: <text>" with token counts that are a function of the text; records every
    call's requests and checks that it is never called from two threads at once."""

    model_name = "recorder"
    cost = ModelCost(weight_bytes=1, kv_bytes_per_token=1)
    tokenizer = "the tokenizer"

    def __init__(self, latency_s: float = 0.0, down: bool = False) -> None:
        self.latency_s, self.down = latency_s, down
        self.batches: list[list[ChatRequest]] = []
        self.inside = 0
        self.overlapped = False

    def chat(self, requests):
        self.inside += 1
        self.overlapped |= self.inside > 1
        try:
            self.batches.append(list(requests))
            time.sleep(self.latency_s)
            if self.down:
                raise EngineUnavailable("engine process gone")
            if any(r.messages[-1].content.startswith("too long") for r in requests):
                raise ContextLengthExceeded("prompt does not fit")
            return [self._answer(r) for r in requests]
        finally:
            self.inside -= 1

    def _answer(self, request: ChatRequest) -> Completion:
        text = request.messages[-1].content
        usage = Usage(prompt_tokens=len(text), cached_tokens=1, completion_tokens=len(text) + 1, seconds=99.0)
        return Completion(text=f"re: {text}", message=Message("assistant", f"re: {text}"), usage=usage)


def ask(text: str, adapter: str | None = None) -> ChatRequest:
    return ChatRequest([Message("user", text)], adapter=adapter)


def together(engine: BatchingEngine, n: int, work) -> list:
    """work(i) in n threads, all members of the engine's group before any starts; results or errors."""
    barrier = threading.Barrier(n)
    out: list = [None] * n

    def run(i: int) -> None:
        with engine.group.member():
            barrier.wait()
            try:
                out[i] = work(i)
            except Exception as error:  # noqa: BLE001 - the test inspects it
                out[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    return out


def test_sixteen_waiting_callers_make_one_batch_of_sixteen():
    engine = Recorder()
    batched = BatchingEngine(engine, window_s=5.0)  # only "everyone waits" can send it in time
    began = time.perf_counter()
    out = together(batched, 16, lambda i: batched.chat([ask(f"q{i}")])[0])
    assert time.perf_counter() - began < 4.0
    assert [len(b) for b in engine.batches] == [16]
    assert [c.text for c in out] == [f"re: q{i}" for i in range(16)]
    assert batched.stats.to_json() == {"engine_calls": 1, "requests": 16, "mean_batch": 16.0, "max_batch": 16}


def test_each_caller_gets_its_own_completions_and_usage():
    engine = Recorder(latency_s=0.05)
    batched = BatchingEngine(engine, window_s=5.0)

    def work(i: int):
        began = time.perf_counter()
        texts = [f"caller {i} request {j}" + "x" * (i + j) for j in range(i % 3 + 1)]  # 1 to 3 requests
        return texts, batched.chat([ask(t) for t in texts]), time.perf_counter() - began

    for texts, completions, wall in together(batched, 6, work):
        assert [c.text for c in completions] == [f"re: {t}" for t in texts]
        assert [(c.usage.prompt_tokens, c.usage.cached_tokens, c.usage.completion_tokens) for c in completions] == [
            (len(t), 1, len(t) + 1) for t in texts]
        # seconds: the caller's wait (the batch forming + the engine call), split over its requests
        seconds = [c.usage.seconds for c in completions]
        assert len(set(seconds)) == 1 and 0.05 / len(texts) <= seconds[0] and sum(seconds) <= wall
    assert engine.batches and sum(len(b) for b in engine.batches) == 1 + 2 + 3 + 1 + 2 + 3
    assert not engine.overlapped


def test_a_lone_member_waits_for_no_window_but_an_unregistered_caller_does():
    engine = Recorder()
    batched = BatchingEngine(engine, window_s=0.3)
    began = time.perf_counter()
    with batched.group.member():
        for i in range(5):
            batched.chat([ask(f"q{i}")])
    assert time.perf_counter() - began < 0.3  # five calls, not one window
    began = time.perf_counter()
    batched.chat([ask("outsider")])
    assert time.perf_counter() - began >= 0.3


def test_max_batch_sends_without_waiting_for_the_window():
    engine = Recorder()
    batched = BatchingEngine(engine, window_s=10.0, max_batch=4)
    threads = [threading.Thread(target=batched.chat, args=([ask(f"q{i}")],)) for i in range(8)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert time.perf_counter() - began < 5.0
    assert [len(b) for b in engine.batches] == [4, 4]


def test_requests_for_different_adapters_share_a_batch():
    engine = Recorder()
    batched = BatchingEngine(engine, window_s=5.0)
    together(batched, 3, lambda i: batched.chat([ask(f"q{i}", adapter=[None, "drafter", "verdict"][i])]))
    assert len(engine.batches) == 1
    assert {r.adapter for r in engine.batches[0]} == {None, "drafter", "verdict"}


def test_an_error_reaches_only_the_caller_whose_request_caused_it():
    engine = Recorder()
    batched = BatchingEngine(engine, window_s=5.0)
    out = together(batched, 4, lambda i: batched.chat([ask("too long" if i == 2 else f"q{i}")])[0])
    assert isinstance(out[2], ContextLengthExceeded)
    assert [c.text for i, c in enumerate(out) if i != 2] == ["re: q0", "re: q1", "re: q3"]
    assert [len(b) for b in engine.batches] == [4, 1, 1, 1, 1]  # the batch, then each caller alone
    assert batched.stats.engine_calls == 5


def test_an_engine_failure_reaches_every_caller_of_the_batch():
    batched = BatchingEngine(Recorder(down=True), window_s=5.0)
    out = together(batched, 3, lambda i: batched.chat([ask(f"q{i}")]))
    assert all(isinstance(e, EngineUnavailable) for e in out)
    assert len({id(e) for e in out}) == 3  # each caller raises its own error object


@dataclass(frozen=True)
class FakeScores:
    logprobs: list[float]
    usage: Usage


class Scorer(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.score_threads: set[int] = set()

    def score(self, requests):
        self.score_threads.add(threading.get_ident())
        return [FakeScores([float(len(r))], Usage(prompt_tokens=len(r), seconds=99.0)) for r in requests]


def test_score_goes_through_the_worker_and_other_attributes_read_through():
    engine = Scorer()
    batched = BatchingEngine(engine)
    scores = batched.score([[1, 2, 3], [4]])
    assert [s.logprobs for s in scores] == [[3.0], [1.0]] and scores[0].usage.seconds < 99.0
    assert threading.get_ident() not in engine.score_threads
    assert batched.tokenizer == "the tokenizer"
    assert not hasattr(BatchingEngine(Recorder()), "score")  # an engine that cannot score
    with pytest.raises(AttributeError):
        getattr(batched, "no_such_attribute")


def test_an_idle_worker_ends_and_the_next_call_starts_another(monkeypatch):
    monkeypatch.setattr(batching, "IDLE_S", 0.05)
    batched = BatchingEngine(Recorder(), window_s=0.0)
    assert batched.chat([ask("one")])[0].text == "re: one"
    deadline = time.perf_counter() + 5
    while any(t.name == "batching:recorder" for t in threading.enumerate()) and time.perf_counter() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "batching:recorder" for t in threading.enumerate())
    assert batched.chat([ask("two")])[0].text == "re: two"


def test_roles_sharing_an_engine_share_one_batching_engine_and_group():
    shared, other = Recorder(), Recorder()
    wrapped = batching_engines({"strong": shared, "weak": shared, "judge": other})
    assert wrapped["strong"] is wrapped["weak"] and wrapped["judge"] is not wrapped["strong"]
    assert wrapped["strong"].group is wrapped["judge"].group
    assert isinstance(wrapped["strong"].group, CallerGroup)
    wrapped["strong"].chat([ask("a"), ask("b")])
    report = batch_report({**wrapped, "plain": Recorder()})
    assert report == [
        {"roles": ["strong", "weak"], "model": "recorder", "engine_calls": 1, "requests": 2, "mean_batch": 2.0,
         "max_batch": 2},
        {"roles": ["judge"], "model": "recorder", "engine_calls": 0, "requests": 0, "mean_batch": 0.0,
         "max_batch": 0},
    ]
