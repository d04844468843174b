"""Many threads, one engine call: the requests of concurrent episodes batched together.

`run_tasks(concurrency=N)` runs N episodes side by side, one per thread, each asking its
engines for one completion at a time. A `BatchingEngine` stands in front of an engine:
callers hand it their requests and block; one worker thread gathers the requests of all
waiting callers and answers them with ONE call of the engine (one `LLM.generate` batch in
vLLM: drafts, verdicts and repairs of different episodes side by side), then hands each
caller its own completions. Only the worker calls the engine, so it need not be
thread-safe. Requests naming different adapters share a batch: vLLM takes a LoRA per
request, transformers groups by adapter inside `chat`, an OpenAI server per request.

When a batch goes: as soon as every thread of the `CallerGroup` waits on some engine of the
group (no one is left to add a request, so waiting longer only adds latency; at
concurrency 1 that is at once), when `max_batch` requests wait, or `window_s` after the
oldest request arrived or the last engine call ended, whichever is later (the callers just
answered get that long to come back with their next request).

Accounting stays per request: each caller gets the engine's completions of its own
requests, with their own token counts. A completion's `usage.seconds` is the caller's wall
time: from its call until its answer (the batch forming, then the batched engine call),
split evenly over its requests, so an episode's per-role seconds still add up to the time it
spent blocked on models. Summed over concurrent episodes, a shared engine call counts once
per episode in it: latency each one saw, not engine time.

Errors: when a batched call raises, each caller's requests are sent again on their own, so
an error (a prompt too long for the context window) reaches only the callers it belongs to.

Determinism: an episode's requests do not depend on the others', so with an engine whose
answers do not depend on the batch (scripted ones) records match concurrency 1 exactly.
Real engines are batch-invariant only up to floating point (padding, kernel choice by
batch shape), so a near-tie greedy token can flip; sampling seeds follow arrival order.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

from specagent.core.errors import EngineError
from specagent.core.interfaces import ChatEngine, ChatRequest, Completion

IDLE_S = 2.0  # a worker with nothing to do for this long ends; the next request starts another


@dataclass(eq=False)
class _Call:
    """One caller's requests to one engine method, and, once answered, the results or the error."""

    method: str
    requests: list[Any]
    arrived: float = field(default_factory=time.perf_counter)
    answered: threading.Event = field(default_factory=threading.Event)
    results: list[Any] = field(default_factory=list)
    error: Exception | None = None


@dataclass(frozen=True)
class BatchStats:
    """Engine calls a BatchingEngine made and the requests they carried."""

    engine_calls: int = 0
    requests: int = 0
    max_batch: int = 0

    @property
    def mean_batch(self) -> float:
        return self.requests / self.engine_calls if self.engine_calls else 0.0

    def to_json(self) -> dict[str, float]:
        return {"engine_calls": self.engine_calls, "requests": self.requests,
                "mean_batch": self.mean_batch, "max_batch": self.max_batch}


class CallerGroup:
    """The threads that share a set of batching engines, and how many of them wait.

    A thread takes part inside `with group.member():` (run_tasks enrolls its workers). While
    every member waits on some engine of the group, a forming batch can grow no more, so it
    goes at once. Without members, only `max_batch` and the window send a batch.
    """

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.members = 0
        self.waiting = 0  # callers whose requests are not answered yet

    @contextmanager
    def member(self) -> Iterator[None]:
        with self.condition:
            self.members += 1
        try:
            yield
        finally:
            with self.condition:
                self.members -= 1
                self.condition.notify_all()  # the others may all be waiting now

    def all_waiting(self) -> bool:
        """Whether every member waits for an answer (call with the condition held)."""
        return 0 < self.members <= self.waiting


class BatchingEngine:
    """A ChatEngine that answers the calls of many threads with batched calls of `engine`.

    `chat` (and `score`, when the engine scores prompts for a verdict head) is batched; other
    attributes (tokenizer, adapters) read through to the engine. See the module docstring
    for when a batch goes, what `usage.seconds` means and where errors go.
    """

    def __init__(
        self, engine: ChatEngine, group: CallerGroup | None = None, window_s: float = 0.01, max_batch: int = 64
    ) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.group = group or CallerGroup()
        self.window_s = window_s
        self.max_batch = max_batch
        self._pending: list[_Call] = []  # guarded by group.condition, as is _worker
        self._worker: threading.Thread | None = None
        self._free_since = 0.0  # when the last engine call ended (worker only)
        self._stats = BatchStats()

    @property
    def cost(self) -> Any:
        return self.engine.cost  # read through: adapters registered later add their bytes

    @property
    def stats(self) -> BatchStats:
        return self._stats

    def close(self) -> None:
        """Close the engine behind it."""
        self.engine.close()

    def chat(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """The engine's completions of `requests`, answered in one batch with other callers'."""
        return self._submit("chat", requests)

    def __getattr__(self, name: str) -> Any:
        if "engine" not in self.__dict__:  # not initialised (copy, unpickle): no engine to read through to
            raise AttributeError(name)
        value = getattr(self.engine, name)
        if name == "score":
            return lambda requests: self._submit("score", requests)
        return value

    # ------------------------------------------------------------------ callers
    def _submit(self, method: str, requests: Sequence[Any]) -> list[Any]:
        if not requests:
            return []
        call = _Call(method, list(requests))
        with self.group.condition:
            self._pending.append(call)
            self.group.waiting += 1
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name=f"batching:{self.model_name}", daemon=True)
                self._worker.start()
            self.group.condition.notify_all()
        call.answered.wait()
        if call.error is not None:
            raise call.error
        seconds = (time.perf_counter() - call.arrived) / len(call.requests)
        return [replace(result, usage=replace(result.usage, seconds=seconds)) for result in call.results]

    # ------------------------------------------------------------------ the worker
    def _serve(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._answer(batch)

    def _next_batch(self) -> list[_Call] | None:
        """Block until a batch should go and take it; None (the worker ends) when idle for IDLE_S."""
        condition = self.group.condition
        with condition:
            if not condition.wait_for(lambda: self._pending, timeout=IDLE_S):
                self._worker = None
                return None
            deadline = max(self._pending[0].arrived, self._free_since) + self.window_s
            condition.wait_for(self._ready, timeout=deadline - time.perf_counter())
            return self._take()

    def _ready(self) -> bool:
        method = self._pending[0].method
        waiting = sum(len(call.requests) for call in self._pending if call.method == method)
        return waiting >= self.max_batch or self.group.all_waiting()

    def _take(self) -> list[_Call]:
        """The oldest call and the calls after it of the same method, up to `max_batch` requests."""
        method = self._pending[0].method
        batch: list[_Call] = []
        size = 0
        for call in self._pending:
            if call.method != method:
                continue
            if batch and size + len(call.requests) > self.max_batch:
                break
            batch.append(call)
            size += len(call.requests)
        self._pending = [call for call in self._pending if call not in batch]
        return batch

    def _answer(self, batch: list[_Call]) -> None:
        try:
            results = self._engine_call(batch[0].method, [r for call in batch for r in call.requests])
        except Exception as error:
            if len(batch) == 1:
                self._deliver(batch[0], [], error)
            else:  # whose request failed? each caller again on its own
                for call in batch:
                    self._answer([call])
            return
        start = 0
        for call in batch:
            self._deliver(call, results[start : start + len(call.requests)], None)
            start += len(call.requests)

    def _engine_call(self, method: str, requests: list[Any]) -> list[Any]:
        s = self._stats
        self._stats = BatchStats(s.engine_calls + 1, s.requests + len(requests), max(s.max_batch, len(requests)))
        try:
            results = getattr(self.engine, method)(requests)
        finally:
            self._free_since = time.perf_counter()
        if len(results) != len(requests):
            raise EngineError(f"{self.model_name}: {method} answered {len(results)} of {len(requests)} requests")
        return results

    def _deliver(self, call: _Call, results: list[Any], error: Exception | None) -> None:
        with self.group.condition:
            call.results, call.error = results, error
            self.group.waiting -= 1
        call.answered.set()


def batching_engines(engines: dict[str, ChatEngine], **options: Any) -> dict[str, BatchingEngine]:
    """Roles' engines behind BatchingEngines, one per distinct engine (roles that share an
    engine share its batches), all in one CallerGroup. `options`: window_s, max_batch."""
    group = CallerGroup()
    wrapped: dict[int, BatchingEngine] = {}
    for engine in engines.values():
        if id(engine) not in wrapped:
            wrapped[id(engine)] = BatchingEngine(engine, group, **options)
    return {role: wrapped[id(engine)] for role, engine in engines.items()}


def batch_report(engines: dict[str, Any]) -> list[dict[str, Any]]:
    """Batch statistics of each distinct BatchingEngine among the roles' engines."""
    roles: dict[int, list[str]] = {}
    for role, engine in engines.items():
        if isinstance(engine, BatchingEngine):
            roles.setdefault(id(engine), []).append(role)
    return [{"roles": names, "model": engines[names[0]].model_name, **engines[names[0]].stats.to_json()}
            for names in roles.values()]
