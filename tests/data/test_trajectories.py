"""The trajectories.jsonl artifact: atomic writes, and reads that name file and line."""

from __future__ import annotations

import json
import os

import pytest

from specagent.core.errors import TaskFileError
from specagent.core.types import Message, ToolCall, ToolSpec, Trajectory
from specagent.records import trajectories as store
from specagent.records.trajectories import TRAJECTORY_FORMAT, read_trajectories, write_trajectories


def sample(traj_id: str = "s:1:0") -> Trajectory:
    return Trajectory(
        id=traj_id,
        task_id="1",
        tools=[ToolSpec("get", "Gets.", {"type": "object", "properties": {"k": {"type": "number"}}}, read_only=True)],
        messages=[
            Message("system", "policy"),
            Message("user", "héllo"),
            Message("assistant", None, (ToolCall("c1", "get", {"k": 1.5, "nested": {"z": [1, None]}}),)),
            Message("tool", "{}", tool_call_id="c1", name="get"),
            Message("assistant", "done"),
        ],
        reward=0.5,
        source="s",
        model="m",
        meta={"trial": 0},
    )


def test_round_trip(tmp_path):
    path = tmp_path / "a" / "trajectories.jsonl"
    assert write_trajectories(path, [sample("x"), sample("y")]) == 2
    assert read_trajectories(path) == [sample("x"), sample("y")]
    first = json.loads(path.read_text().splitlines()[0])
    assert first["format"] == TRAJECTORY_FORMAT
    assert first["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"k": 1.5, "nested": {"z": [1, null]}}'
    assert first["tools"][0]["read_only"] is True


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, [sample("old")])
    before = path.read_text()

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_trajectories(path, [sample("new")])
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["trajectories.jsonl"]


@pytest.mark.parametrize(
    "line, problem",
    [
        ("{not json", ":2: invalid JSON"),
        ("[1]", ":2: expected a JSON object, got list"),
        ('{"id": "z", "task_id": "1", "messages": []}', ":2: format is None, expected 'specagent.trajectory/v1'"),
        (json.dumps({"format": TRAJECTORY_FORMAT, "id": "z", "task_id": "1"}), ":2: missing required key 'messages'"),
        (json.dumps({"format": TRAJECTORY_FORMAT, "id": "z", "task_id": "1", "messages": [{"content": "x"}]}),
         ":2: messages[0]: expected an object with a 'role'"),
        (json.dumps(sample("a").to_json()), ":2: duplicate trajectory id 'a' (first on line 1)"),
    ],
)
def test_read_errors_name_file_and_line(tmp_path, line, problem):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(sample("a").to_json()) + "\n" + line + "\n\n")
    with pytest.raises(TaskFileError) as err:
        read_trajectories(path)
    assert str(err.value).startswith(f"{path}{problem}")


def test_missing_file(tmp_path):
    with pytest.raises(TaskFileError, match="cannot read trajectory file"):
        read_trajectories(tmp_path / "nope.jsonl")
