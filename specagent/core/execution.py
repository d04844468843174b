"""Running tool calls with a timeout that means what it says (DESIGN §1 invariants).

A timeout must never report a call as not run while the call still runs later. So each call
starts at once, in a thread of its own (no shared pool, no queue to wait in), and its
timeout counts from the moment it started. A call that has not returned by then *did*
start: its effect is unknown. The episode records that and stops (for a state-changing
call), and the environment it ran in is not reused while the call may still be running,
so a late write cannot land in another episode's state.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from specagent.core.types import ToolCall


@dataclass(frozen=True)
class ToolOutcome:
    """What became of one call: its observation, and whether it returned within the timeout."""

    observation: str
    finished: bool  # False: it started and was still running at the timeout (effect unknown)
    seconds: float


class ToolRunner:
    """Runs one environment's calls, one at a time, each in its own daemon thread."""

    def __init__(self, execute: Callable[[ToolCall], object], timeout_s: float) -> None:
        self._execute = execute
        self.timeout_s = timeout_s
        self._unfinished: list[tuple[str, threading.Thread]] = []

    def run(self, call: ToolCall) -> ToolOutcome:
        started = threading.Event()
        result: dict[str, object] = {}

        def target() -> None:
            started.set()
            try:
                result["observation"] = str(self._execute(call))
            except Exception as err:  # a tool bug is an observation, never a crash of the episode
                result["observation"] = f"Error: tool {call.name} failed: {type(err).__name__}: {err}"
            except BaseException as err:  # SystemExit, KeyboardInterrupt: raised in the episode's thread below
                result["raised"] = err

        thread = threading.Thread(target=target, name=f"specagent-tool-{call.name}", daemon=True)
        thread.start()
        started.wait()  # the timeout counts from the call's start, not from thread scheduling
        start = time.perf_counter()
        thread.join(self.timeout_s)
        seconds = time.perf_counter() - start
        if thread.is_alive():
            self._unfinished.append((call.name, thread))
            return ToolOutcome(f"Error: tool {call.name} timed out after {self.timeout_s:g}s; it may still be "
                               "running and its effect is unknown", finished=False, seconds=seconds)
        if "raised" in result:
            raise result["raised"]
        return ToolOutcome(str(result["observation"]), finished=True, seconds=seconds)

    def still_running(self) -> list[str]:
        """Names of the calls that timed out and have not returned since."""
        self._unfinished = [(name, t) for name, t in self._unfinished if t.is_alive()]
        return [name for name, _ in self._unfinished]
