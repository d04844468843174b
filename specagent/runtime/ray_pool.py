"""Work items on a pool of Ray actors: the optional executor of `collect`, `mine` and `eval`.

Each actor runs a *worker*: the object the stage's single-process path runs, built inside
the actor from the stage's config, so it holds its own engines (a vLLM engine on its GPU,
transformers on its CPUs) and its own environment. The driver hands each actor
`per_actor` items at a time, takes results as they finish (`ray.wait`) and gives them to
the stage, which writes them through its resumable file. Hence:

- a killed driver resumes from that file exactly as a killed single-process run does;
- an actor that dies (its process, its node) loses only the items it was running: it is
  replaced by a fresh one and those items are resubmitted, each at most `max_retries` times.
  An item runs on one actor at a time and its result is handed over once, so nothing is
  lost and nothing is written twice. An item with side effects outside the actor (an
  episode on an MCP server that keeps its state) is never resubmitted: the run stops
  (`no_resubmit` says why);
- an error the worker itself raises (a bad prompt, a bug) is not retried: it stops the run
  as it would locally, with every result handed over so far kept.

`ray` is imported here only, and only when a stage runs with `executor.kind: ray`.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

from specagent.config import ExecutorConfig
from specagent.core.errors import SpecAgentError

Item = TypeVar("Item")


def require_ray() -> Any:
    """The `ray` module, or a SpecAgentError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise SpecAgentError("executor.kind 'ray' (--ray) needs Ray: pip install 'specagent[ray]'") from None
    return ray


def check_executor(executor: ExecutorConfig) -> None:
    """Before a stage writes anything: an executor of kind `ray` needs Ray installed."""
    if executor.kind == "ray":
        require_ray()


def connect(executor: ExecutorConfig) -> bool:
    """Join (or start) the Ray cluster of ``executor.address``, unless this process already
    is in one (a test's local cluster, a Ray job). True when this call started the session,
    so the caller shuts it down at the end."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    ray.init(address=executor.address, include_dashboard=False, log_to_driver=True)
    return True


@dataclass
class PoolStats:
    """What the driver saw: items finished, actors replaced, items resubmitted."""

    finished: int = 0
    actors_lost: int = 0
    resubmitted: int = 0


class ActorPool(Generic[Item]):
    """``executor.actors`` Ray actors of ``worker_cls(*args)``, each asking Ray for
    ``executor.num_cpus`` / ``num_gpus``. Use as a context manager: leaving it kills the
    actors (after the last item, an error, or Ctrl-C), so no actor outlives its driver."""

    def __init__(self, worker_cls: type, args: tuple, executor: ExecutorConfig, per_actor: int = 1,
                 no_resubmit: str | None = None) -> None:
        self._ray = require_ray()
        self._executor = executor
        self.per_actor = per_actor
        self.no_resubmit = no_resubmit  # why an item must not run twice (its side effects stay): stop instead
        self._remote = self._ray.remote(worker_cls).options(
            num_cpus=executor.num_cpus, num_gpus=executor.num_gpus, max_concurrency=per_actor)
        self._args = args
        self.stats = PoolStats()
        self.actors = [self._start() for _ in range(executor.actors)]

    @property
    def slots(self) -> int:
        """Items the pool runs at once."""
        return len(self.actors) * self.per_actor

    def _start(self) -> Any:
        return self._remote.remote(*self._args)

    def __enter__(self) -> "ActorPool[Item]":
        return self

    def __exit__(self, *exc: Any) -> None:
        for actor in self.actors:
            self._ray.kill(actor, no_restart=True)

    def map(self, method: str, items: Sequence[Item],
            on_submit: Callable[[Item], None] | None = None) -> Iterator[tuple[Item, Any]]:
        """(item, ``worker.method(item)``) for every item, in the order they finish;
        ``on_submit(item)`` runs just before an item goes to an actor."""
        queue: deque[int] = deque(range(len(items)))
        inflight: dict[Any, tuple[int, int, Any]] = {}  # ref -> (item index, actor slot, actor)
        tries = [0] * len(items)
        while queue or inflight:
            self._fill(method, items, queue, inflight, on_submit)
            ready, _ = self._ray.wait(list(inflight), num_returns=1)
            n, slot, actor = inflight.pop(ready[0])
            try:
                result = self._ray.get(ready[0])
            except self._ray.exceptions.RayActorError as err:
                self._lost(slot, actor, err)
                if self.no_resubmit:
                    raise SpecAgentError(f"{_short(items[n])} was running on an actor that died, and is not "
                                         f"resubmitted: {self.no_resubmit}. Check that state, then rerun the "
                                         "command to resume the items not yet written.") from None
                tries[n] += 1
                if tries[n] > self._executor.max_retries:
                    raise SpecAgentError(f"{_short(items[n])} failed on {tries[n]} actors that died running it "
                                         f"(executor.max_retries {self._executor.max_retries}); last: "
                                         f"{_first_line(err)}") from None
                self.stats.resubmitted += 1
                queue.appendleft(n)
                continue
            self.stats.finished += 1
            yield items[n], result

    def _fill(self, method: str, items: Sequence[Item], queue: deque[int], inflight: dict,
              on_submit: Callable[[Item], None] | None) -> None:
        """Give every actor items until it runs ``per_actor`` of them or none is left."""
        busy = [0] * len(self.actors)
        for _, slot, _ in inflight.values():
            busy[slot] += 1
        for slot, actor in enumerate(self.actors):
            while queue and busy[slot] < self.per_actor:
                n = queue.popleft()
                if on_submit is not None:
                    on_submit(items[n])
                inflight[getattr(actor, method).remote(items[n])] = (n, slot, actor)
                busy[slot] += 1

    def _lost(self, slot: int, actor: Any, err: Exception) -> None:
        """An actor died: replace it once (its other items fail the same way and are resubmitted)."""
        if self.actors[slot] is not actor:
            return  # already replaced
        self._ray.kill(actor, no_restart=True)
        self.actors[slot] = self._start()
        self.stats.actors_lost += 1
        print(f"ray: actor {slot} lost ({_first_line(err)}); a fresh one takes its items", file=sys.stderr)


@dataclass
class Progress:
    """The driver's throughput figures: units done (episodes, segments), the seconds their
    workers spent inside engines, and since when."""

    unit: str
    count: int = 0
    engine_s: float = 0.0
    began: float = field(default_factory=time.perf_counter)

    def add(self, count: int, engine_s: float) -> None:
        self.count += count
        self.engine_s += engine_s

    def line(self, pool: ActorPool) -> str:
        """E.g. `ray: 40 segments in 12.0s = 3.33/s (200.0/min) on 2 actor(s) x 1; engine share 91.0%`.
        The engine share is of the pool's slots: engine seconds / (wall seconds x slots)."""
        seconds = time.perf_counter() - self.began
        rate = self.count / seconds if seconds > 0 else 0.0
        share = self.engine_s / (seconds * pool.slots) if seconds > 0 else 0.0
        return (f"ray: {self.count} {self.unit} in {seconds:.1f}s = {rate:.3f}/s ({60 * rate:.1f}/min) on "
                f"{len(pool.actors)} actor(s) x {pool.per_actor}; engine share {share:.1%}; actors lost "
                f"{pool.stats.actors_lost}, items resubmitted {pool.stats.resubmitted}")


def _short(item: Any) -> str:
    text = repr(item)
    return f"item {text if len(text) <= 80 else text[:77] + '...'}"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def shutdown_if(started: bool) -> None:
    """Shut down the Ray session `connect` started (a cluster it joined keeps running)."""
    if started:
        require_ray().shutdown()
