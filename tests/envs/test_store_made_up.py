"""Store runs with the user renamed to a made-up person (`collect` with made_up_users)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from specagent.cli import main
from specagent.config import CollectConfig
from specagent.core.types import Message, ToolCall, Trajectory
from specagent.envs.store.build_db import PEOPLE
from specagent.envs.store.generate import FIRST_NAMES, LAST_NAMES
from specagent.envs.store.made_up import FIRST, LAST, identity, rename
from specagent.records.trajectories import read_trajectories

ROOT = Path(__file__).resolve().parents[2]
DRILLS = ROOT / "configs/collect/store_made_up_drills.yaml"


def words(trajectory: Trajectory) -> str:
    """Everything a model reads or writes in a run, but the system prompt."""
    return " ".join(f"{m.content or ''} {[(c.name, c.arguments) for c in m.tool_calls]}"
                    for m in trajectory.messages if m.role != "system")


def test_made_up_names_are_names_the_store_never_uses():
    store = set(FIRST_NAMES) | set(LAST_NAMES) | {name for person in PEOPLE for name in person}
    assert not (set(FIRST) | set(LAST)) & store
    assert len(set(FIRST)) == len(FIRST) and len(set(LAST)) == len(LAST)


def check_renamed(original: Trajectory, renamed: Trajectory) -> None:
    old, new = identity(original), identity(renamed)
    first, last = renamed.meta["made_up_user"].split()
    assert new == {"first": first, "last": last, "user_id": f"{first.lower()}_{last.lower()}_" + old["user_id"].split("_")[-1]}
    text = words(renamed)
    for name in (old["first"], old["last"]):
        assert not re.search(rf"(?<![A-Za-z]){name}(?![a-z])", text, re.IGNORECASE)
    assert old["user_id"] not in text
    # the ticket and the identifying call name the same made-up person
    ticket = renamed.messages[1].content
    call = next(c for m in renamed.messages for c in m.tool_calls if c.name.startswith("find_user_id_by_"))
    if call.name == "find_user_id_by_email":
        assert call.arguments["email"] in ticket and call.arguments["email"].startswith(f"{first.lower()}.{last.lower()}")
    else:
        assert (call.arguments["first_name"], call.arguments["last_name"]) == (first, last) and first in ticket
    # everything else is untouched: same roles, same tools, same number of messages
    assert [(m.role, [c.name for c in m.tool_calls]) for m in renamed.messages] == \
           [(m.role, [c.name for c in m.tool_calls]) for m in original.messages]


def test_collect_renames_every_run_and_keeps_it_consistent(tmp_path):
    """Whole runs (not just the drills' first step) of several kinds: the made-up user is the one
    the ticket names, the lookup finds and every later call uses; the real user is gone."""
    real, made_up = tmp_path / "real.jsonl", tmp_path / "made_up.jsonl"
    common = ["env.kinds=[status,cancel,address,refuse_cancel]", "env.limit=24", "protocol.max_steps=16"]
    assert main(["collect", "-c", str(DRILLS), f"output={real}", "made_up_users=false", *common]) == 0
    assert main(["collect", "-c", str(DRILLS), f"output={made_up}", *common]) == 0
    originals, renamed = read_trajectories(real), read_trajectories(made_up)
    assert len(renamed) == len(originals) == 24
    for original, new in zip(originals, renamed):
        assert new.id == f"{original.id}:made-up" and new.reward == original.reward
        check_renamed(original, new)
        user_id = identity(new)["user_id"]
        later = [c.arguments["user_id"] for m in new.messages for c in m.tool_calls if "user_id" in c.arguments]
        assert all(u == user_id for u in later)
    assert len({t.meta["made_up_user"] for t in renamed}) > 12  # a fresh person per run, from 3,600


def test_the_drills_config_stops_after_the_lookup(tmp_path):
    out = tmp_path / "drills.jsonl"
    assert main(["collect", "-c", str(DRILLS), f"output={out}", "env.limit=10"]) == 0
    for trajectory in read_trajectories(out):
        assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool"]
        assert identity(trajectory) is not None


def test_whole_words_only_and_a_run_without_a_lookup_is_left_out():
    call = ToolCall("c1", "find_user_id_by_email", {"email": "kai.xu5@example.com"})
    run = Trajectory("t", "task", [], [
        Message("user", "Hi, Kai Xu here (kai.xu5@example.com). Is my Kaiser mixer, order W1001, shipped? Xuan says no."),
        Message("assistant", None, tool_calls=[call]),
        Message("tool", "kai_xu_1005", tool_call_id="c1", name=call.name),
        Message("assistant", "Kai, your Kaiser mixer has shipped."),
    ])
    new = rename(run, random.Random(3))
    first, last = new.meta["made_up_user"].split()
    assert new.messages[0].content == (f"Hi, {first} {last} here ({first.lower()}.{last.lower()}5@example.com). "
                                       "Is my Kaiser mixer, order W1001, shipped? Xuan says no.")
    assert new.messages[2].content == f"{first.lower()}_{last.lower()}_1005"
    assert new.messages[3].content == f"{first}, your Kaiser mixer has shipped."
    refused = Trajectory("r", "task", [], [Message("user", "Hi, I'm Kai."), Message("assistant", "Who are you?")])
    assert rename(refused, random.Random(0)) is None


def test_made_up_users_outside_the_store_is_a_config_error(tmp_path):

    with pytest.raises(ValidationError, match="made_up_users: only the store"):
        CollectConfig.model_validate({"env": {"name": "airline", "airline": {"data_dir": str(tmp_path)}},
                                      "made_up_users": True})
