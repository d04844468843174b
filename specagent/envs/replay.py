"""``ReplayEnv``: an environment made of recorded trajectories, for mining without a live one.

Drafts must be grounded (DESIGN §6): a drafted read-only call is executed for real or
found in a recorded log, never guessed. This environment is the recorded log. Each
episode is one recorded trajectory (``reset(trajectory_id)``), and a call's result is an
observation recorded for the *same canonical call* (``canonical_call``: argument order,
``1`` vs ``1.0`` and surrounding whitespace in strings do not matter) *in the same state*.

The state. Every run of a task starts from the same initial database, and the database
after a prefix of a run is determined by the state-changing calls that succeeded so far.
So the state is keyed by ``(task id, the canonical state-changing calls that succeeded
before, in order)``. A call changes state when its tool is not classified read-only
(unknown means write) and its result does not start with ``"Error"`` (tau-bench and tau2
report a refused call that way, and a refused call changes nothing). The environment's
own state starts empty on ``reset``, grows when a state-changing call is executed (and
answered), and is placed at any point of the current recording with ``seek(n_messages)``
(the run's successful state-changing calls among its first ``n_messages``): miners call
``reset(id)`` then ``seek(len(context))`` at each cut point. ``epoch`` is the number of
those calls.

The rule. A call is answered only by an observation recorded at the current state key,
in this run or in any other run of the same task (runs that made the same writes share
their observations; at the start, every run of the task does):

- when this run recorded the call at this state, its own (first) observation;
- otherwise, when the other runs that recorded it at this state all agree, that text.

Nothing else answers: an observation recorded before a write never answers a lookup made
after it, nor one recorded after it a lookup before it, however often the call returned
the same text elsewhere. (Checked against the live airline environment at every cut point
of the shared GPT-4o runs, the earlier rules that allowed this answered 2,143 lookups from
another state, 576 of them wrong; answers keyed by state: none wrong, ``test_replay_live``.)
Runs that disagree at one state are counted in ``stats().state_conflicts``.

Anything else is *unrecorded*: ``execute`` returns a text starting with
``"Error: unrecorded call"``, changes nothing, and counts it in ``unrecorded`` /
``unrecorded_calls``. Miners should ask ``is_recorded(call)`` first and end a draft before
an unrecorded read-only call, rather than feed the drafter an observation that never
happened.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from specagent.core.canonical import canonical_call
from specagent.core.classify import changed_state, classify_tools
from specagent.core.interfaces import Reward
from specagent.core.types import Message, ToolCall, ToolSpec, Trajectory, union_tools

UNRECORDED_PREFIX = "Error: unrecorded call"

State = tuple[str, ...]  # the canonical state-changing calls that succeeded so far, in order


def default_terminal(name: str) -> bool:
    """Calls that end the conversation: transfers to a human agent."""
    return name.startswith("transfer_to_human")


@dataclass(frozen=True)
class Recorded:
    """One recorded call: where it was made, the state it ran in, what it returned."""

    key: str
    message_index: int  # index of the assistant message holding the call
    epoch: int  # len(state): the successful state-changing calls before it
    observation: str
    writes: bool  # the call changed state (its tool is not read-only, and it did not fail)
    state: State = ()  # the successful state-changing calls before it, canonical, in order


@dataclass(frozen=True)
class ReplayStats:
    """What the recordings hold, and how often the same call gave different answers."""

    trajectories: int
    recorded_calls: int
    distinct_keys: int  # distinct (trajectory, canonical call)
    conflicting_keys: int  # ... of which returned different texts within the run
    same_epoch_conflicts: int  # ... of which differed without a write in between
    state_conflicts: int = 0  # (task, state, call) that different runs recorded with different texts


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
        """``read_only``/``write`` override the trajectories' own flags (for the state keys);
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
        self._terminal = _terminal_predicate(terminal)
        ends = [tool.name for tool in self._tools if self._terminal(tool.name)]
        self._read_only = classify_tools(self._tools, read_only, write, terminal=ends)
        self._records = {t.id: self._record(t) for t in trajectories}
        # (task, state, call) -> [(run, observation)], in the order of the trajectories
        self._at_state: dict[tuple[str, State, str], list[tuple[str, str]]] = defaultdict(list)
        for trajectory in trajectories:
            for record in self._records[trajectory.id]:
                self._at_state[(trajectory.task_id, record.state, record.key)].append(
                    (trajectory.id, record.observation))
        self._lock = threading.Lock()
        self._current: Trajectory | None = None
        self.state: State = ()
        self.unrecorded = 0
        self.unrecorded_calls: list[str] = []
        self.replayed = 0

    # ------------------------------------------------------------ the Environment protocol

    def tool_specs(self) -> list[ToolSpec]:
        """Every tool of the recordings (the first spec seen for each name), classified: the
        user's lists over the recordings' flags, write where runs disagree, terminal never read-only."""
        return [replace(tool, read_only=self._read_only[tool.name]) for tool in self._tools]

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
            self.state = ()
        return opening_messages(self._current)

    @property
    def epoch(self) -> int:
        """The number of successful state-changing calls behind the current state."""
        return len(self.state)

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
                    f"{UNRECORDED_PREFIX} {key}: no run of task {trajectory.task_id!r} made this call in this"
                    " state, so its result is unknown"
                )
            self.replayed += 1
            if self._changes_state(call.name, observation):
                self.state = (*self.state, key)
            return observation

    def close(self) -> None:
        """Nothing to end: the recordings live in memory."""

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
        state = tuple(r.key for r in self._records[trajectory.id] if r.writes and r.message_index < n_messages)
        with self._lock:
            self.state = state

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
        state_conflicts = sum(
            len({run for run, _ in found}) > 1 and not _all_same(text for _, text in found)
            for found in self._at_state.values()
        )
        return ReplayStats(
            trajectories=len(self._trajectories),
            recorded_calls=sum(len(r) for r in self._records.values()),
            distinct_keys=keys,
            conflicting_keys=conflicting,
            same_epoch_conflicts=same_epoch,
            state_conflicts=state_conflicts,
        )

    # ------------------------------------------------------------ internals

    def _require_current(self) -> Trajectory:
        if self._current is None:
            raise RuntimeError("ReplayEnv: call reset(trajectory_id) first")
        return self._current

    def _record(self, trajectory: Trajectory) -> list[Recorded]:
        out: list[Recorded] = []
        state: State = ()
        for index, message in enumerate(trajectory.messages):
            if message.role != "assistant" or not message.tool_calls:
                continue
            results = _results_after(trajectory.messages, index)
            for call in message.tool_calls:
                if call.id not in results:
                    continue  # an unanswered call (the importer refuses these; hand-made lists may not)
                key = canonical_call(call.name, call.arguments)
                writes = self._changes_state(call.name, results[call.id])
                out.append(Recorded(key, index, len(state), results[call.id], writes, state))
                if writes:
                    state = (*state, key)
        return out

    def _changes_state(self, tool: str, observation: str) -> bool:
        return changed_state(self._read_only.get(tool), observation)

    def _lookup(self, trajectory: Trajectory, key: str) -> str | None:
        """The observation recorded for ``key`` at the current state (the module docstring's rule), or None."""
        found = self._at_state.get((trajectory.task_id, self.state, key))
        if not found:
            return None
        own = [text for run, text in found if run == trajectory.id]
        if own:
            return own[0]
        return found[0][1] if _all_same(text for _, text in found) else None


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
