"""The train/validation split of a mine run: ids are strings, unknown validation ids are an
error, and related runs (a group key of their meta) stay on one side."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.config import MineConfig, load_config
from specagent.core.errors import ConfigError
from specagent.core.types import Message, Trajectory
from specagent.data.datasets import task_split


def runs(groups: dict[str, str]) -> list[Trajectory]:
    return [Trajectory(f"r{task}", task, [], [Message("user", "hi")], 1.0, meta={"user_id": user})
            for task, user in groups.items()]


def test_integer_ids_in_yaml_are_read_as_strings():
    cfg = load_config(MineConfig, None, ["trajectories=t.jsonl", "validation_tasks=[20, 21, x]"])
    assert cfg.validation_tasks == ["20", "21", "x"]


def test_a_validation_id_that_matches_no_trajectory_is_an_error():
    with pytest.raises(ConfigError, match="validation_tasks: 1 id.s. match no trajectory: 99"):
        task_split(runs({"20": "a", "21": "b"}), ["20", "99"], 0.2)


def test_listing_a_task_takes_its_whole_group_to_validation():
    trajectories = runs({"1": "ann", "2": "ann", "3": "bob", "4": "cy"})
    assert task_split(trajectories, ["1"], 0.0, "user_id") == {"1": "validation", "2": "validation", "3": "train",
                                                               "4": "train"}
    assert task_split(trajectories, ["1"], 0.0)["2"] == "train"  # by task: the same user on both sides


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), st.sampled_from("uvwxyz"), min_size=1, max_size=30),
       st.floats(0.0, 0.99))
def test_a_group_never_straddles_the_split(groups, fraction):
    split = task_split(runs(groups), None, fraction, "user_id")
    sides: dict[str, set[str]] = {}
    for task, user in groups.items():
        sides.setdefault(user, set()).add(split[task])
    assert all(len(s) == 1 for s in sides.values())


def test_a_mine_reads_only_its_tasks_then_strides_and_limits(tmp_path):
    from specagent.data.stage import mined_trajectories
    from specagent.records.trajectories import write_trajectories

    path = tmp_path / "trajectories.jsonl"
    trajectories = [Trajectory(f"r{task}:{trial}", task, [], [Message("user", "hi")], 1.0)
                    for task in ("1", "2", "3") for trial in range(4)]
    write_trajectories(path, trajectories)

    def read(*overrides: str) -> list[str]:
        return [t.id for t in mined_trajectories(load_config(MineConfig, None, [f"trajectories={path}", *overrides]))]

    assert read("tasks=[3, 1]") == [f"r1:{n}" for n in range(4)] + [f"r3:{n}" for n in range(4)]  # file order
    assert read("tasks=[1, 3]", "stride=4") == ["r1:0", "r3:0"]
    assert read("tasks=[2]", "limit=1") == ["r2:0"]
    assert len(read()) == 12
    with pytest.raises(ConfigError, match=r"tasks: \['9'\] name no trajectory"):
        read("tasks=[1, 9]")


def test_a_mine_with_min_reward_reads_only_the_runs_that_scored_it(tmp_path):
    from specagent.data.stage import mined_trajectories
    from specagent.records.trajectories import write_trajectories

    path = tmp_path / "trajectories.jsonl"
    rewards = {"1": 1.0, "2": 0.0, "3": None, "4": 0.5}
    write_trajectories(path, [Trajectory(f"r{task}:0", task, [], [Message("user", "hi")], reward)
                              for task, reward in rewards.items()])

    def read(*overrides: str) -> list[str]:
        return [t.id for t in mined_trajectories(load_config(MineConfig, None, [f"trajectories={path}", *overrides]))]

    assert read() == ["r1:0", "r2:0", "r3:0", "r4:0"]
    assert read("min_reward=1.0") == ["r1:0", "r3:0"]  # a run without a reward is kept
    assert read("min_reward=0.5", "limit=2") == ["r1:0", "r3:0"]  # the filter comes before limit
    assert read("min_reward=1.0", "tasks=[2, 3]") == ["r3:0"]
    assert read("min_reward=1.0", "validation_tasks=[3]") == ["r1:0", "r3:0"]
    # a validation task whose every run falls below min_reward names min_reward as the cause
    with pytest.raises(ConfigError, match=r"validation_tasks: 1 id\(s\) have no run with reward >= min_reward 1.0: 2"):
        read("min_reward=1.0", "validation_tasks=[2, 3]")
