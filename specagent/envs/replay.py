"""``ReplayEnv``: an environment made of recorded trajectories, for mining without a live one.

Drafts must be grounded (DESIGN §6): a drafted read-only call is executed for real or
found in a recorded log, never guessed. This environment is the recorded log. Each
episode is one recorded trajectory (``reset(trajectory_id)``), and a call's result is the
observation that trajectory recorded for the *same canonical call* (``canonical_call``:
argument order, ``1`` vs ``1.0`` and surrounding whitespace in strings do not matter).

Where the run's state changes, the same call can return different results (a reservation
read before and after it was changed). Observations are therefore kept per *write
epoch*: the number of state-changing calls that came before the call in the recording.
A call changes state when its tool is not classified read-only (unknown means write) and
its result does not start with ``"Error"`` (tau-bench and tau2 report a refused call that
way, and a refused call changes nothing). The environment's own epoch starts at 0 on
``reset``, advances when a recorded state-changing call is executed, and is placed at any
point of the recording with ``seek(n_messages)``: miners call ``reset(id)`` then
``seek(len(context))`` at each cut point. A call is answered, in this order:

1. from this run, at the current epoch (exact: same run, same state);
2. from this run, when the call was recorded at an earlier and a later epoch than the
   current one with the same text (the writes in between did not affect it);
3. at epoch 0, from the other runs of the same task at their epoch 0, when they agree
   (every run of a task starts from the same state);
4. from the other runs of the same task, when every recorded occurrence of the call, in
   this run and the others, returned the same text, at least twice (a call whose result
   never varied; one occurrence alone says nothing about other states).

Anything else is *unrecorded*: ``execute`` returns a text starting with
``"Error: unrecorded call"``, and counts it in ``unrecorded`` / ``unrecorded_calls``.
Miners should ask ``is_recorded(call)`` first and end a draft before an unrecorded
read-only call, rather than feed the drafter an observation that never happened.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from specagent.core.canonical import canonical_call
from specagent.core.classify import classify_tools
from specagent.core.interfaces import Reward
from specagent.core.types import Message, ToolCall, ToolSpec, Trajectory, union_tools

UNRECORDED_PREFIX = "Error: unrecorded call"


def default_terminal(name: str) -> bool:
    """Calls that end the conversation: transfers to a human agent."""
    return name.startswith("transfer_to_human")


@dataclass(frozen=True)
class Recorded:
    """One recorded call: where it was made, the write epoch it ran in, what it returned."""

    key: str
    message_index: int  # index of the assistant message holding the call
    epoch: int
    observation: str
    writes: bool  # the call changes state (its tool is not read-only)


@dataclass(frozen=True)
class ReplayStats:
    """What the recordings hold, and how often the same call gave different answers."""

    trajectories: int
    recorded_calls: int
    distinct_keys: int  # distinct (trajectory, canonical call)
    conflicting_keys: int  # ... of which returned different texts within the run
    same_epoch_conflicts: int  # ... of which differed without a write in between


class ReplayEnv:
    """Recorded trajectories behind the ``Environment`` protocol (``reset`` takes a trajectory id)."""

    def __init__(
        self,
        trajectories: Sequence[Trajectory],
        *,
        read_only: Iterable[str] = (),
        write: Iterable[str] = (),
        terminal: Iterable[str] | Callable[[str], bool] | None = None,
        name: str = "replay",
    ) -> None:
        """``read_only``/``write`` override the trajectories' own flags (for the write epochs);
        ``terminal`` is a set of tool names, a predicate, or None for ``transfer_to_human*``."""
        if not trajectories:
            raise ValueError("ReplayEnv needs at least one trajectory")
        self.name = name
        self._trajectories: dict[str, Trajectory] = {}
        for trajectory in trajectories:
            if trajectory.id in self._trajectories:
                raise ValueError(f"duplicate trajectory id {trajectory.id!r}")
            self._trajectories[trajectory.id] = trajectory
        self._tools = union_tools(trajectories)
        self._read_only = classify_tools(self._tools, read_only, write)
        self._terminal = _terminal_predicate(terminal)
        self._records = {t.id: self._record(t) for t in trajectories}
        self._runs_of_task: dict[str, list[str]] = defaultdict(list)
        for trajectory in trajectories:
            self._runs_of_task[trajectory.task_id].append(trajectory.id)
        self._lock = threading.Lock()
        self._current: Trajectory | None = None
        self.epoch = 0
        self.unrecorded = 0
        self.unrecorded_calls: list[str] = []
        self.replayed = 0

    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> "ReplayEnv":
        """A replay environment over a ``trajectories.jsonl`` file."""
        from specagent.data.trajectories import read_trajectories

        return cls(read_trajectories(path), **kwargs)

    # ------------------------------------------------------------ the Environment protocol

    def tool_specs(self) -> list[ToolSpec]:
        """Every tool of the recordings (the first spec seen for each name)."""
        return list(self._tools)

    def task_ids(self) -> list[str]:
        """The trajectory ids: each recorded run is one episode."""
        return list(self._trajectories)

    def reset(self, task_id: str) -> list[Message]:
        """Select the recorded run ``task_id`` (a trajectory id) at its start; returns its
        opening messages: everything up to and including the first user message."""
        if task_id not in self._trajectories:
            raise KeyError(f"unknown trajectory {task_id!r}; see ReplayEnv.task_ids()")
        with self._lock:
            self._current = self._trajectories[task_id]
            self.epoch = 0
        return opening_messages(self._current)

    def execute(self, call: ToolCall) -> str:
        """The recorded observation of an equivalent call, or an ``Error: unrecorded call`` text."""
        trajectory = self._require_current()
        key = canonical_call(call.name, call.arguments)
        with self._lock:
            observation = self._lookup(trajectory, key)
            if observation is None:
                self.unrecorded += 1
                self.unrecorded_calls.append(key)
                return (
                    f"{UNRECORDED_PREFIX} {key}: run {trajectory.id!r} never made this call in this state,"
                    " so its result is unknown"
                )
            self.replayed += 1
            self.epoch += self._changes_state(call.name, observation)
            return observation

    def is_terminal(self, call: ToolCall) -> bool:
        return isinstance(call.name, str) and self._terminal(call.name)

    def user_turn(self, reply: str) -> str | None:
        """Recorded users cannot answer new messages: the conversation ends."""
        return None

    def reward(self, messages: Sequence[Message]) -> Reward:
        """The recorded run's reward (not a judgment of ``messages``)."""
        trajectory = self._require_current()
        info = {"source": "replay", "trajectory": trajectory.id, "recorded": trajectory.reward is not None}
        return Reward(reward=float(trajectory.reward or 0.0), info=info)

    def state_hash(self) -> str:
        """Constant: a replay has no database to hash."""
        return "replay"

    # ------------------------------------------------------------ for miners

    def is_recorded(self, call: ToolCall) -> bool:
        """Would ``execute(call)`` return a recorded observation (now, in this state)?"""
        trajectory = self._require_current()
        with self._lock:
            return self._lookup(trajectory, canonical_call(call.name, call.arguments)) is not None

    def seek(self, n_messages: int) -> None:
        """Place the state after the first ``n_messages`` of the current recording (a cut point)."""
        trajectory = self._require_current()
        if not 0 <= n_messages <= len(trajectory.messages):
            size = len(trajectory.messages)
            raise ValueError(f"seek({n_messages}) is outside run {trajectory.id!r} of {size} messages")
        writes = sum(1 for r in self._records[trajectory.id] if r.writes and r.message_index < n_messages)
        with self._lock:
            self.epoch = writes

    def recorded_calls(self, trajectory_id: str) -> list[Recorded]:
        """Every recorded call of a run, in order."""
        return list(self._records[trajectory_id])

    def stats(self) -> ReplayStats:
        keys = conflicting = same_epoch = 0
        for records in self._records.values():
            by_key: dict[str, list[Recorded]] = defaultdict(list)
            for record in records:
                by_key[record.key].append(record)
            keys += len(by_key)
            for group in by_key.values():
                if len({r.observation for r in group}) > 1:
                    conflicting += 1
                    by_epoch: dict[int, set[str]] = defaultdict(set)
                    for r in group:
                        by_epoch[r.epoch].add(r.observation)
                    same_epoch += any(len(texts) > 1 for texts in by_epoch.values())
        return ReplayStats(
            trajectories=len(self._trajectories),
            recorded_calls=sum(len(r) for r in self._records.values()),
            distinct_keys=keys,
            conflicting_keys=conflicting,
            same_epoch_conflicts=same_epoch,
        )

    # ------------------------------------------------------------ internals

    def _require_current(self) -> Trajectory:
        if self._current is None:
            raise RuntimeError("ReplayEnv: call reset(trajectory_id) first")
        return self._current

    def _record(self, trajectory: Trajectory) -> list[Recorded]:
        out: list[Recorded] = []
        epoch = 0
        for index, message in enumerate(trajectory.messages):
            if message.role != "assistant" or not message.tool_calls:
                continue
            results = _results_after(trajectory.messages, index)
            for call in message.tool_calls:
                if call.id not in results:
                    continue  # an unanswered call (the importer refuses these; hand-made lists may not)
                writes = self._changes_state(call.name, results[call.id])
                out.append(Recorded(canonical_call(call.name, call.arguments), index, epoch, results[call.id], writes))
                epoch += writes
        return out

    def _changes_state(self, tool: str, observation: str) -> bool:
        return not self._read_only.get(tool, False) and not observation.startswith("Error")

    def _lookup(self, trajectory: Trajectory, key: str) -> str | None:
        """The observation rules 1-4 of the module docstring give, or None."""
        own = [r for r in self._records[trajectory.id] if r.key == key]
        at_epoch = [r.observation for r in own if r.epoch == self.epoch]
        if at_epoch:
            return at_epoch[0]
        if own and _all_same(r.observation for r in own) and own[0].epoch < self.epoch < own[-1].epoch:
            return own[0].observation
        others = [
            r for run in self._runs_of_task[trajectory.task_id] if run != trajectory.id
            for r in self._records[run] if r.key == key
        ]
        if self.epoch == 0:
            initial = [r.observation for r in others if r.epoch == 0]
            if initial and _all_same(initial):
                return initial[0]
        everywhere = [r.observation for r in own + others]
        if others and len(everywhere) >= 2 and _all_same(everywhere):
            return everywhere[0]
        return None


def opening_messages(trajectory: Trajectory) -> list[Message]:
    """The messages up to and including the first user message (system policy + request)."""
    for index, message in enumerate(trajectory.messages):
        if message.role == "user":
            return list(trajectory.messages[: index + 1])
    return [m for m in trajectory.messages if m.role == "system"]


def _results_after(messages: Sequence[Message], index: int) -> dict[str, str]:
    """The tool results right after message ``index``, by call id. Paired by position, not
    over the whole run: some logs reuse a call id in later turns."""
    results: dict[str, str] = {}
    for message in messages[index + 1 :]:
        if message.role != "tool":
            break
        results.setdefault(message.tool_call_id or "", message.content or "")
    return results


def _all_same(texts: Iterable[str]) -> bool:
    return len(set(texts)) == 1


def _terminal_predicate(terminal: Iterable[str] | Callable[[str], bool] | None) -> Callable[[str], bool]:
    if terminal is None:
        return default_terminal
    if callable(terminal):
        return terminal
    names = frozenset(terminal)
    return names.__contains__
