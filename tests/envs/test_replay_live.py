"""ReplayEnv against the live airline environment: every answer it gives at any cut point of
the shared GPT-4o runs must be what the live environment returns in that run's state there."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import pytest

from specagent.core.canonical import canonical_call
from specagent.core.types import ToolCall, Trajectory
from specagent.envs.replay import ReplayEnv
from tests.data.conftest import AIRLINE_RUNS, airline_import, airline_path  # noqa: F401 (fixtures)


@dataclass
class Comparison:
    probes: int = 0  # (cut point, lookup) pairs asked
    answered: int = 0  # ... that the replay answered
    wrong: int = 0  # ... with a text the live environment contradicts
    examples: list[str] = field(default_factory=list)


def compare_with_live(replay: ReplayEnv, trajectories: Sequence[Trajectory], live, read_only: set[str]) -> Comparison:
    """For every run, every cut point (after each of its messages, and before the first) and
    every canonical read-only call recorded in any run of its task: if ``replay`` answers the
    call there, the live environment (reset to the task and driven through the run's own calls
    up to the cut) must return the same text. ``replay`` is any object with ReplayEnv's API."""
    lookups: dict[str, dict[str, ToolCall]] = defaultdict(dict)  # task -> canonical call -> one spelling
    for trajectory in trajectories:
        for message in trajectory.messages:
            for call in message.tool_calls:
                if call.name in read_only:
                    lookups[trajectory.task_id].setdefault(canonical_call(call.name, call.arguments), call)
    out = Comparison()
    for trajectory in trajectories:
        replay.reset(trajectory.id)
        live.reset(trajectory.task_id)
        for cut in range(len(trajectory.messages) + 1):
            if cut:
                for call in trajectory.messages[cut - 1].tool_calls:
                    live.execute(call)  # the run's own call, read or write, as it made it
            replay.seek(cut)
            for key, lookup in lookups[trajectory.task_id].items():
                out.probes += 1
                if not replay.is_recorded(lookup):
                    continue
                out.answered += 1
                answer, truth = replay.execute(lookup), live.execute(lookup)
                if answer != truth:
                    out.wrong += 1
                    if len(out.examples) < 5:
                        out.examples.append(f"{trajectory.id} after {cut} messages: {key}")
    return out


@pytest.fixture(scope="module")
def live(airline_path):
    from specagent.envs.airline import AirlineEnv

    return AirlineEnv(AIRLINE_RUNS.parent, AIRLINE_RUNS)


def test_every_replayed_answer_matches_the_live_environment(airline_import, live):
    """37,210 (cut point, lookup) pairs over the 100 runs. The earlier rules (same run and
    write epoch; the same text before and after writes; epoch 0 across runs; a text that
    "never varied") answered 32,361 of them, 576 wrong: all among the 2,143 answered from
    another state. Keyed by state: 30,232 answered (14 of them new, from runs that made the
    same writes), none wrong."""
    trajectories, _ = airline_import
    replay = ReplayEnv(trajectories)
    read_only = {t.name for t in trajectories[0].tools if t.read_only}
    started = time.perf_counter()
    result = compare_with_live(replay, trajectories, live, read_only)
    print(f"replay vs live: {result.answered} of {result.probes} lookups answered, {result.wrong} wrong"
          f" ({time.perf_counter() - started:.1f} s)")
    assert result.wrong == 0, result.examples
    assert (result.answered, result.probes) == (30_232, 37_210)
    assert replay.unrecorded == 0  # asking (is_recorded) first leaves nothing unrecorded
