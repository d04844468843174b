"""Generated attacks on the rerun guard (`StartJournal`): on an environment whose state
outlives an episode (an MCP server that keeps what it was told), an episode that started
must never run a second time unless the user cleared its journal line.

Each example is a sequence of runs of the same eval, each killed at a generated point:
at the k-th state-changing tool call, or in the middle of the k-th line written to disk
(a journal line or an episode record torn by the kill), and of users clearing the journal.
A kill is an exception no code of the runtime catches (`BaseException`), raised where the
process would die; a torn line is what the kill leaves of that line. After every step:
no episode ran more often than 1 + the times the user cleared it; a refused resume ran
nothing and named every interrupted episode; the episodes file holds each episode once.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specagent.runtime.episodes as episodes
from specagent.core.errors import SpecAgentError
from specagent.core.protocol import Models, ProtocolConfig
from specagent.core.verify import GenerativeVerifier
from specagent.engines.scripted import ScriptedEngine
from specagent.records.base import read_jsonl
from specagent.records.episodes import StartedEpisode
from specagent.runtime.episodes import StartJournal, read_episodes, run_tasks
from tests.core.toy import ToyEnv, random_policy

TASKS = ["t0", "t1", "t2"]
MODES = ["strong", "specagent"]
TRIALS = 2
KEYS = {(t, m, trial) for trial in range(TRIALS) for m in MODES for t in TASKS}
HAZARD = "the toy server keeps its state"


class Killed(BaseException):
    """The process dies here: nothing after it runs."""


class Server(ToyEnv):
    """The toy environment whose k-th state-changing call of this run kills the process."""

    def __init__(self, kill_at_write: int | None) -> None:
        super().__init__()
        self.kill_at_write, self.writes = kill_at_write, 0

    def task_ids(self) -> list[str]:
        return TASKS

    def execute(self, call):
        if call.name in ("set", "delete", "transfer", "peek"):
            self.writes += 1
            if self.writes == self.kill_at_write:
                raise Killed
        return super().execute(call)


def models() -> Models:
    strong = ScriptedEngine(random_policy(2), "strong")
    weak = ScriptedEngine(random_policy(1, allow_malformed=False), "weak")
    return Models(strong=strong, weak=weak, verifier=GenerativeVerifier(strong))


kills = st.one_of(
    st.none(),
    st.tuples(st.just("write"), st.integers(1, 12)),
    st.tuples(st.just("line"), st.integers(1, 16), st.floats(0.0, 0.99)),
)
steps = st.lists(st.one_of(st.tuples(st.just("run"), kills), st.tuples(st.just("clear"), st.sampled_from(["lines", "file"]))),
                 min_size=1, max_size=8)


def run_once(out: Path, kill, monkeypatch: pytest.MonkeyPatch, plays: Counter) -> str:
    """One run of the eval (each mode an arm); 'done', 'refused' or 'killed'."""
    written = [0]
    real_append = episodes.append_record

    def append(sink, record):
        written[0] += 1
        if kill is not None and kill[0] == "line" and written[0] == kill[1]:
            line = json.dumps(record) + "\n"
            sink.write(line[: int(len(line) * kill[2])])  # what the kill leaves of the line
            sink.flush()
            raise Killed
        real_append(sink, record)

    real_play = episodes.play_episode

    def play(env, job, *args):
        plays[job.key] += 1
        return real_play(env, job, *args)

    monkeypatch.setattr(episodes, "append_record", append)
    monkeypatch.setattr(episodes, "play_episode", play)
    env = Server(kill[1] if kill is not None and kill[0] == "write" else None)
    try:
        for mode in MODES:
            run_tasks(env, TASKS, [mode], models(), ProtocolConfig(max_draft_steps=3, max_steps=6), out,
                      trials=TRIALS, arm=mode, rerun_hazard=HAZARD)
    except Killed:
        return "killed"
    except SpecAgentError as err:
        assert "started and never finished" in str(err)
        return "refused"
    finally:
        monkeypatch.undo()
    return "done"


def journal_key(line: str) -> tuple[str, str, int]:
    started = json.loads(line)
    return started["task_id"], started["arm"], started["trial"]


def started_keys(journal: Path) -> set[tuple[str, str, int]]:
    if not journal.exists():
        return set()
    return {(e.task_id, e.arm, e.trial) for e in read_jsonl(journal, StartedEpisode, "journal", torn_tail_ok=True)}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=steps)
def test_no_episode_runs_twice_on_a_stateful_server_whatever_kills_it(plan, monkeypatch):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "episodes.jsonl"
        journal = StartJournal(out, HAZARD).path
        plays, cleared = Counter(), Counter()
        for action, arg in [*plan, ("clear", "file"), ("run", None)]:  # at the end the user clears and reruns
            done = {episodes.episode_key(r) for r in read_episodes(out)}
            interrupted = started_keys(journal) - done
            if action == "clear":
                cleared.update(interrupted)
                if arg == "file":
                    journal.unlink(missing_ok=True)
                elif journal.exists():
                    keep = [line for line in journal.read_text().splitlines(keepends=True)
                            if line.endswith("\n") and journal_key(line) not in interrupted]
                    journal.write_text("".join(keep))
                continue
            before = Counter(plays)
            outcome = run_once(out, arg, monkeypatch, plays)
            if interrupted:  # a resume over an interrupted episode runs nothing
                assert outcome == "refused" and plays == before
            else:
                assert outcome != "refused"
            for key in KEYS:
                assert plays[key] <= 1 + cleared[key], (key, plays[key], cleared[key])
            keys = [episodes.episode_key(r) for r in read_episodes(out)]
            assert len(keys) == len(set(keys))
        assert {episodes.episode_key(r) for r in read_episodes(out)} == KEYS
