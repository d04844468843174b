"""The store at training scale: the extended database, the task splits, the user modes."""

from __future__ import annotations

import collections
import hashlib
import json
import re

import pytest

from specagent.cli import main
from specagent.config import EnvConfig, load_config
from specagent.core.errors import ConfigError
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Message
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv, generate
from specagent.envs.store.build_db import PEOPLE, build_db
from specagent.envs.store.build_tasks import render_tasks
from specagent.envs.store.env import ALL_CATEGORIES, CATEGORIES, SPLITS, TASKS_PATH, canonical_hash, normalize_text
from specagent.envs.store.expert import expert_policy, expert_steps
from specagent.envs.store.tools import run_tool
from specagent.runtime.assembly import build_env

# Pinned so that an accidental change to the generator (or to build_db) is caught; change
# them only on purpose, with the task counts below.
SEED_HASH = "ff563702feea8ddad8de73da312b76f189f7edd13bbf3f62b0dea7e5ef23a8e9"
DB_HASH = "daf7caa38d11bec9807104f93721417de5349ca02bec1a22a5c12777e85f20c1"
TASK_HASHES = {
    "train": "c5861c0bd62b0794bf469439f6b4fd2e8838c8c9c6e73c3a9b7ca9b7e648f434",
    "calibration": "02090e707433ce6a044686f72464bb09464542db5492a1dac9ad218695a20bbe",
    "eval": "4449d1cee085b08a9c74f59be47f8ba4f9823bddd311cad32e5070158e54f174",
}
HAND_IDS = [json.loads(line)["id"] for line in TASKS_PATH.read_text().splitlines() if line.strip()]
NAMES = set(generate.FIRST_NAMES) | set(generate.LAST_NAMES) | {n for pair in PEOPLE for n in pair}


def generated(split: str) -> list[dict]:
    return [t for t in generate.split_tasks(split) if "split" in t]


def opening(task: dict, user: str) -> str:
    return task["request"] if user == "ticket" else task["user_modes"]["multi_turn"]["request"]


def mask(text: str) -> str:
    """A request's wording with who, which ids and which amounts taken out."""
    text = re.sub(r"\S+@example\.com", "<email>", text)
    text = re.sub(r"\b[WR]\d{3,4}\b", "<id>", text)
    text = re.sub(r"\d+(\.\d+)?", "<n>", text)
    return " ".join("<name>" if word.strip(".,;:!?()") in NAMES else word for word in text.split())


def user_of(task: dict, db: dict) -> str:
    """The user a task is about, from the lookup that identifies them."""
    find = task["expert_lookups"][0]
    return run_tool(db, find["name"], find["arguments"])


# ---------------------------------------------------------------- the extended database


def test_extended_db_is_deterministic_and_pinned():
    """Built at first use (~10 ms here), never shipped as a file: the same bytes every time.
    (No wall-time bound: on a loaded CI machine any absolute figure is noise.)"""
    first = generate.build_extended_db()
    second = generate.build_extended_db()
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert canonical_hash(first) == DB_HASH == canonical_hash(generate.extended_db())


def test_extended_db_keeps_the_seed_and_adds_hundreds_of_users():
    seed, db = build_db(), generate.extended_db()
    for table, records in seed.items():
        assert {key: db[table][key] for key in records} == records, table
    users = list(db["users"].values())[len(PEOPLE):]
    assert len(users) == generate.GENERATED_USERS >= 200
    assert all(2 <= len(u["orders"]) <= 4 for u in users)
    assert {db["orders"][o]["status"] for u in users for o in u["orders"]} == {
        "pending", "processed", "delivered", "cancelled"}
    kinds = collections.Counter(m["kind"] for u in users for m in u["payment_methods"])
    assert kinds["credit_card"] == kinds["store_credit"] == len(users) and kinds["gift_card"] and kinds["paypal"]
    assert {r["kind"] for r in db["returns"].values()} == {"return", "exchange"}
    assert len({u["email"] for u in db["users"].values()}) == len(db["users"])
    assert len({(u["first_name"], u["last_name"], u["address"]["zip"]) for u in db["users"].values()}) == len(
        db["users"])
    # ids run on from the seed's, so new returns get the next number as the tools assign it
    assert list(db["orders"]) == [f"W{1001 + n}" for n in range(len(db["orders"]))]
    assert list(db["returns"]) == [f"R{1 + n:03d}" for n in range(len(db["returns"]))]


def test_incremental_hash_equals_the_canonical_one():
    base = generate.bases()["extended"]
    assert base.hash_of(base.fresh()) == base.hash == DB_HASH
    tasks = generated("calibration") + generated("eval")
    for task in tasks[::3]:
        db = base.fresh()
        for action in task["gold_actions"]:
            run_tool(db, action["name"], action["arguments"])
        assert base.hash_of(db) == canonical_hash(db), task["id"]


# ---------------------------------------------------------------- the splits


@pytest.mark.parametrize("split", SPLITS)
def test_split_tasks_are_deterministic_and_pinned(split):
    first = render_tasks(generate.build_split_tasks(split, generate.build_extended_db()))
    second = render_tasks(generate.build_split_tasks(split, generate.build_extended_db()))
    assert first == second == render_tasks(generated(split))
    assert hashlib.sha256(first.encode()).hexdigest() == TASK_HASHES[split]


def test_counts_categories_and_ids():
    counts = {split: collections.Counter(t["category"] for t in generated(split)) for split in SPLITS}
    assert sum(counts["train"].values()) >= 500
    assert sum(counts["calibration"].values()) >= 60 and sum(counts["eval"].values()) >= 60
    assert all(set(c) == set(ALL_CATEGORIES) for c in counts.values()), counts
    eval_ids = [t["id"] for t in generate.split_tasks("eval")]
    assert eval_ids[-len(HAND_IDS):] == HAND_IDS  # the hand-checked tasks belong to eval
    ids = [t["id"] for split in SPLITS for t in generated(split)]
    assert len(ids) == len(set(ids)) and not set(ids) & set(HAND_IDS)
    assert all(re.fullmatch(r"(train|calibration|eval)-[a-z_]+-\d{4}", i) for i in ids)
    assert all(t["id"].startswith(t["split"] + "-") for split in SPLITS for t in generated(split))


def test_splits_share_no_user_order_or_email():
    db = generate.extended_db()
    owners = generate.split_user_ids(db)
    assert sorted(u for users in owners.values() for u in users) == sorted(db["users"])  # a partition
    seen: dict[str, dict[str, set]] = {}
    for split in SPLITS:
        users = {user_of(t, db) for t in generate.split_tasks(split)}
        assert users <= set(owners[split]), split
        orders = {o for u in users for o in db["users"][u]["orders"]}
        seen[split] = {"users": users, "orders": orders, "emails": {db["users"][u]["email"] for u in users}}
    for held_out in ("calibration", "eval"):
        for key in ("users", "orders", "emails"):
            assert not seen["train"][key] & seen[held_out][key], (held_out, key)
    assert not seen["calibration"]["users"] & seen["eval"]["users"]


@pytest.mark.parametrize("user", ["ticket", "multi_turn"])
def test_no_held_out_request_is_worded_like_a_training_one(user):
    train = {mask(opening(t, user)) for t in generate.split_tasks("train")}
    for split in ("calibration", "eval"):
        shared = [opening(t, user) for t in generate.split_tasks(split) if mask(opening(t, user)) in train]
        assert shared == [], shared[:3]


def test_held_out_templates_per_category():
    used = {split: collections.defaultdict(set) for split in SPLITS}
    for split in SPLITS:
        for task in generated(split):
            used[split][task["category"]].add(task["template"])
    for category in ALL_CATEGORIES:
        train = used["train"][category]
        assert len(train) >= 4 and all(".t" in key for key in train), category  # several, none held out
        for split in ("calibration", "eval"):
            held_out = {key for key in used[split][category] if ".h" in key}
            assert len(held_out) >= 2 and not held_out & train, (split, category)
            assert used[split][category] & train, (split, category)  # mixed with training templates


@pytest.mark.parametrize("split", SPLITS)
def test_openings_and_answers_identify_the_task(split):
    # the expert tells tasks with a shared multi_turn opening apart by the user's answers
    for user in ("ticket", "multi_turn"):
        env = StoreEnv(split=split, user=user)
        tasks = [env.task(t) for t in env.task_ids()]
        keys = [(t["request"], tuple(d["answer"] for d in t.get("withheld", []))) for t in tasks]
        assert len(set(keys)) == len(keys), user


def test_per_kind_keeps_the_split_and_adds_each_kinds_next_tasks():
    """A larger held-out split: the split's own tasks first, unchanged; then each kind's next
    ones, drawn for that kind alone, so a smaller size is a prefix of a larger one per kind."""
    own = generated("eval")
    more = [t for t in generate.split_tasks("eval", 8) if "split" in t]
    assert more[: len(own)] == own
    assert set(collections.Counter(t["kind"] for t in more).values()) == {8}
    assert generate.split_tasks("eval", 8)[-len(HAND_IDS):] == generate.hand_tasks()
    ids = [t["id"] for t in more]
    assert len(ids) == len(set(ids)) and "eval-cancel-0008" in ids
    fewer = [t for t in generate.split_tasks("eval", 5) if "split" in t]
    assert all(t in more for t in fewer) and len(fewer) == 5 * len(set(t["kind"] for t in own))
    assert [t["id"] for t in generate.split_tasks("eval", 1) if "split" in t] == [
        t["id"] for t in own if t["id"].endswith("-0001")]
    # held out as the split's own: its users, none of train's orders, no training wording
    db = generate.extended_db()
    owners = generate.split_user_ids(db)
    users = {user_of(t, db) for t in more}
    assert users <= set(owners["eval"])
    train = {mask(opening(t, user)) for t in generate.split_tasks("train") for user in ("ticket", "multi_turn")}
    assert not [t["id"] for t in more for user in ("ticket", "multi_turn") if mask(opening(t, user)) in train]


def test_per_kind_beyond_a_kinds_users_is_an_error():
    with pytest.raises(LookupError, match="no user of the split left .* kind"):
        generate.build_split_tasks("eval", generate.extended_db(), 40)
    with pytest.raises(ValueError, match="per_kind"):
        generate.build_split_tasks("eval", generate.extended_db(), 0)
    with pytest.raises(ValueError, match="give a split"):
        StoreEnv(per_kind=4)


@pytest.mark.parametrize("user", ["ticket", "multi_turn"])
def test_expert_scores_one_on_the_extra_tasks(user):
    env = StoreEnv(split="eval", user=user, per_kind=6)
    models = Models(strong=ScriptedEngine(expert_policy(env)))
    extra = [t for t in env.task_ids() if re.search(r"-000[3-6]$", t)]
    assert len(extra) == 4 * sum(len(kinds) for kinds in generate.KINDS.values())
    failed = {}
    for task_id in extra:
        episode = run_episode(env, task_id, "strong", models, ProtocolConfig())
        missing = ungrounded(env, task_id, episode.messages)
        if episode.reward != 1.0 or episode.stop_reason != "user_done" or missing:
            failed[task_id] = (episode.stop_reason, episode.reward_info, missing)
    assert failed == {}, list(failed.items())[:3]


# ---------------------------------------------------------------- the expert, through the protocol


def ungrounded(env: StoreEnv, task_id: str, messages: list[Message]) -> list[str]:
    """Required facts that neither the tools (on the whole database) nor the user said: the
    generator computes facts on one user's slice of it, this checks they hold on all of it."""
    said = [m.content for m in messages if m.role in ("tool", "user") and m.content]
    forbidden = env.task(task_id).get("forbidden_action")
    if forbidden:  # what the refused write would have answered
        said.append(run_tool(env._base_of(env.task(task_id)).fresh(), forbidden["name"], forbidden["arguments"]))
    seen = normalize_text(" ".join(said))
    return [f for f in env.task(task_id)["required_facts"] if normalize_text(f) not in seen]


@pytest.mark.parametrize("user", ["ticket", "multi_turn"])
@pytest.mark.parametrize("split", SPLITS)
def test_expert_scores_one_on_every_task(split, user):
    env = StoreEnv(split=split, user=user)
    models = Models(strong=ScriptedEngine(expert_policy(env)))
    failed = {}
    for task_id in env.task_ids():
        episode = run_episode(env, task_id, "strong", models, ProtocolConfig())
        missing = ungrounded(env, task_id, episode.messages)
        if episode.reward != 1.0 or episode.stop_reason != "user_done" or missing:
            failed[task_id] = (episode.stop_reason, episode.reward_info, missing)
    assert failed == {}, list(failed.items())[:3]


def test_expert_asks_for_what_is_withheld_before_acting():
    env = StoreEnv(split="train", user="multi_turn")
    task_id = next(t for t in env.task_ids() if t.startswith("train-ask_address-"))
    steps = expert_steps(env, task_id)
    asked = [n for n, m in enumerate(steps) if not m.tool_calls][:-1]
    assert asked == [0, 2, 4]  # who (first), which order (after finding the user), where (after the lookups)
    assert [c.id for m in steps for c in m.tool_calls] == [f"call_{n}" for n in range(len(steps) - 4)]
    episode = run_episode(env, task_id, "strong", Models(strong=ScriptedEngine(expert_policy(env))))
    answers = [m.content for m in episode.messages[2:] if m.role == "user"]
    assert answers == [d["answer"] for d in env.task(task_id)["withheld"]] and episode.reward == 1.0


# ---------------------------------------------------------------- the scripted user


def test_multi_turn_user_answers_only_when_asked():
    env = StoreEnv(split="calibration", user="multi_turn")
    task_id = next(t for t in env.task_ids() if "-cancel-" in t)
    who, which = env.task(task_id)["withheld"]
    opening = env.reset(task_id)[1].content
    assert "@" not in opening and not re.search(r"W\d{4}", opening)
    assert env.user_turn("Let me look into that for you.") is None  # asks nothing: the conversation ends
    env.reset(task_id)
    assert env.user_turn("Sure! Could you give me your email?") == who["answer"]
    assert env.user_turn("Could you give me your email?") is None  # already given
    env.reset(task_id)
    assert env.user_turn("What's your email and the order id?") == f"{who['answer']} {which['answer']}"
    assert env.user_turn("Your order is cancelled.") is None


def test_ticket_user_withholds_only_the_multi_turn_detail():
    env = StoreEnv(split="train")
    task_id = next(t for t in env.task_ids() if t.startswith("train-ask_refund-"))
    (detail,) = env.task(task_id)["withheld"]
    opening = env.reset(task_id)[1].content
    assert "@example.com" in opening or "zip" in opening  # who, which order, what: all but where the refund goes
    assert re.search(r"W\d{4}", opening) and detail["answer"] not in opening
    assert env.user_turn("Done, your return is requested.") is None
    env.reset(task_id)
    assert env.user_turn("Where should the refund go: original payment method or store credit?") == detail["answer"]
    assert all(env.task(t)["withheld"] == [] for t in env.task_ids() if env.task(t)["category"] != "multi_turn")


def test_an_agent_that_never_asks_fails_a_multi_turn_task():
    env = StoreEnv(split="eval", user="multi_turn")
    task_id = "single_write_01"
    episode = run_episode(env, task_id, "strong", Models(strong=ScriptedEngine(lambda m, t: "I will cancel it.")))
    assert episode.stop_reason == "user_done" and episode.reward == 0.0
    assert [m.role for m in episode.messages] == ["system", "user", "assistant"]


# ---------------------------------------------------------------- split=None and wiring


def test_split_none_is_unchanged():
    env = StoreEnv()
    assert env.task_ids() == HAND_IDS and len(HAND_IDS) == 42
    assert env.initial_hash() == canonical_hash(build_db()) == SEED_HASH
    assert [env.task(t) for t in HAND_IDS] == [json.loads(line) for line in TASKS_PATH.read_text().splitlines()]
    assert {env.task(t)["category"] for t in HAND_IDS} == set(CATEGORIES)


def test_hand_tasks_in_eval_keep_the_seed_database():
    env = StoreEnv(split="eval")
    assert env.initial_hash() == DB_HASH  # before any reset: the split's database
    env.reset("single_write_06")
    assert env.initial_hash() == SEED_HASH
    env.reset(generated("eval")[0]["id"])
    assert env.initial_hash() == DB_HASH


def test_generated_tasks_run_from_a_task_file(tmp_path):
    path = tmp_path / "calibration.jsonl"
    path.write_text(render_tasks(generated("calibration")))
    for user in ("ticket", "multi_turn"):
        env = StoreEnv(tasks_path=path, user=user)
        models = Models(strong=ScriptedEngine(expert_policy(env)))
        for task_id in env.task_ids()[::8]:
            assert run_episode(env, task_id, "strong", models).reward == 1.0, (user, task_id)
        assert env.initial_hash() == DB_HASH


def test_bad_split_user_or_combination():
    with pytest.raises(ValueError, match="split"):
        StoreEnv(split="test")
    with pytest.raises(ValueError, match="user"):
        StoreEnv(user="chatty")
    with pytest.raises(ValueError, match="not both"):
        StoreEnv(tasks_path=TASKS_PATH, split="train")


def test_build_env_passes_split_and_user():
    env = build_env(EnvConfig(split="calibration", user="multi_turn"))
    assert (env.split, env.user, len(env.task_ids())) == ("calibration", "multi_turn", len(generated("calibration")))
    assert build_env(EnvConfig()).split is None
    env = build_env(EnvConfig(split="eval", per_kind=3, kinds=["cancel"]))
    assert "eval-cancel-0003" in env.task_ids()
    with pytest.raises(ConfigError, match="per_kind sizes a generated store split"):
        load_config(EnvConfig, None, ["per_kind=3"])
    # the config refuses what the store alone can do, before any environment is built
    with pytest.raises(ConfigError, match="split and user are for the store environment"):
        load_config(EnvConfig, None, ["name=mcp", "split=train"])
    with pytest.raises(ConfigError, match="split and user are for the store environment"):
        load_config(EnvConfig, None, ["name=airline", "airline.data_dir=x", "user=multi_turn"])
    with pytest.raises(ConfigError, match="exclude"):
        load_config(EnvConfig, None, ["split=train", f"tasks_path={TASKS_PATH}"])


def test_cli_lists_a_splits_tasks(capsys):
    assert main(["env", "tasks", "store", "--split", "calibration"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tasks = generated("calibration")
    assert lines[0] == "\t".join([tasks[0]["id"], tasks[0]["category"], tasks[0]["request"]])
    assert len(lines) == len(tasks) + 1 and lines[-1].startswith(f"{len(tasks)} tasks (calibration, user ticket): ")
    assert "multi_turn 10" in lines[-1] and "lookup 14" in lines[-1]
    assert main(["env", "tasks", "store", "--split", "eval", "--user", "multi_turn", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == len(generate.split_tasks("eval")) and set(rows[0]) == {"id", "category", "request"}
    assert not any("@example.com" in row["request"] for row in rows)
    assert main(["env", "tasks", "store", "--split", "eval", "--per-kind", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"{len(generate.split_tasks('eval', 3))} tasks (eval")


def test_cli_rejects_an_unknown_split(capsys):
    with pytest.raises(SystemExit):
        main(["env", "tasks", "store", "--split", "test"])
    assert "invalid choice" in capsys.readouterr().err


def test_multi_turn_messages_are_well_formed():
    env = StoreEnv(split="train", user="multi_turn")
    for task_id in env.task_ids()[::25]:
        for step in expert_steps(env, task_id):
            assert isinstance(step, Message) and step.role == "assistant"
            assert bool(step.tool_calls) != bool(step.content)


def test_exclude_task_ids_leaves_tasks_out_and_checks_them():
    from specagent.runtime.assembly import select_tasks

    env = StoreEnv()
    chosen = select_tasks(env, EnvConfig(exclude_task_ids=["lookup_01"]))
    assert "lookup_01" not in chosen and len(chosen) == len(env.task_ids()) - 1
    with pytest.raises(ConfigError, match="env.exclude_task_ids: unknown task ids"):
        select_tasks(env, EnvConfig(exclude_task_ids=["lookup_1"]))


def test_kinds_select_the_generated_tasks_of_those_kinds_and_are_checked():
    from pydantic import ValidationError

    from specagent.runtime.assembly import select_tasks

    env = StoreEnv(split="eval")
    chosen = select_tasks(env, EnvConfig(split="eval", kinds=["status", "cancel"]))
    assert chosen == ["eval-status-0001", "eval-status-0002", "eval-cancel-0001", "eval-cancel-0002"]
    assert select_tasks(env, EnvConfig(split="eval", kinds=["status"], limit=1)) == ["eval-status-0001"]
    with pytest.raises(ConfigError, match=r"env.kinds: no task of kind \['stauts'\]"):
        select_tasks(env, EnvConfig(split="eval", kinds=["stauts"]))
    with pytest.raises(ValidationError, match="kinds selects generated store tasks"):
        EnvConfig(kinds=["status"])  # the hand-checked tasks have categories, not kinds
