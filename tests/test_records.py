"""The typed records between stages: written and read by one model each; a malformed record
is an error naming the file, the line and the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.errors import TaskFileError
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import DraftedStep, Message, StepKind, ToolCall
from specagent.data.mine import finished_ids
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from specagent.records.episodes import EpisodeRecord
from specagent.records.segments import DraftedStepRecord, VerdictRow
from specagent.runtime.episodes import episode_record, read_episodes


def an_episode() -> dict:
    env = StoreEnv()
    ep = run_episode(env, "lookup_01", "strong", Models(strong=ScriptedEngine(env.expert())), ProtocolConfig())
    return episode_record(ep, trial=0, models={"strong": "expert"})


def test_an_episode_record_round_trips_through_its_model():
    record = an_episode()
    assert record["format"] == "specagent.episode/v1" and EpisodeRecord.parse(record, "x").dump() == record


@pytest.mark.parametrize("field,value,expected", [
    ("reward", "high", "reward: Input should be a valid number"),
    ("trial", -1, "trial: Input should be greater than or equal to 0"),
    ("counts", [], "counts: Input should be a valid dictionary"),
    ("surprise", 1, "surprise: Extra inputs are not permitted"),
])
def test_a_malformed_episode_line_names_file_line_and_field(tmp_path, field, value, expected):
    good = an_episode()
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, field: value}) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(TaskFileError, match=rf"{path}:2: not a valid EpisodeRecord: {expected}"):
        read_episodes(path)


def test_a_missing_field_is_named(tmp_path):
    good = an_episode()
    del good["final_hash"]
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(good) + "\n")
    with pytest.raises(TaskFileError, match=r":1: not a valid EpisodeRecord: final_hash: Field required"):
        read_episodes(path)


def test_a_shard_line_whose_segment_is_malformed_names_the_field(tmp_path):
    path = tmp_path / "shard-000-of-001.jsonl"
    step = {"message": {"role": "assistant", "content": "hi"}, "kind": "guess", "observations": [], "malformed": None}
    segment = {"id": "t@2", "trajectory_id": "t", "task_id": "x", "cut": 2, "steps": [step], "ended_by": "held",
               "labels": [0], "label_source": "match"}
    path.write_text(json.dumps({"trajectory_id": "t", "segments": [segment]}) + "\n")
    with pytest.raises(TaskFileError, match=r"shard-000-of-001.jsonl:1: not a valid ShardRow: segments\.0\.steps\.0\.kind"):
        finished_ids(path)


KINDS = st.sampled_from(list(StepKind))
TEXT = st.text(max_size=20)


@settings(max_examples=100, deadline=None)
@given(KINDS, TEXT, st.lists(st.tuples(st.sampled_from(["get", "set"]), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)), max_size=2), st.none() | TEXT)
def test_a_drafted_step_round_trips(kind, text, calls, malformed):
    message = Message("assistant", text or None, tuple(ToolCall(f"c{i}", n, a) for i, (n, a) in enumerate(calls)))
    observations = tuple(Message("tool", "{}", tool_call_id=c.id, name=c.name) for c in message.tool_calls)
    step = DraftedStep(message, kind, observations, malformed)
    assert DraftedStepRecord.parse(json.loads(json.dumps(DraftedStepRecord.of(step).dump())), "x").step() == step


def test_a_verdict_row_gives_its_prompt_and_tools():
    row = VerdictRow(segment_id="s", task_id="t", label_source="match", messages=[{"role": "user", "content": "hi"}],
                     tools=[{"type": "function", "function": {"name": "get", "description": "", "parameters": {}}}],
                     step_message_indices=[1], labels=[1], prompt=[{"role": "user", "content": "hi"}],
                     completion=[{"role": "assistant", "content": "1"}])
    assert row.chat() == [Message("user", "hi")] and row.tool_specs()[0].name == "get"
    with pytest.raises(TaskFileError, match="verdict row: not a valid VerdictRow: labels"):
        VerdictRow.parse({**row.dump(), "labels": "1"}, "verdict row")


def test_an_atomically_written_file_gets_the_usual_permissions(tmp_path):
    import os

    from specagent.records.trajectories import atomic_write_text

    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "out.jsonl", "{}\n")
    finally:
        os.umask(umask)
    assert (tmp_path / "out.jsonl").stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0o600
