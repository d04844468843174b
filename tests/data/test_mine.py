"""Mining: labels, resume-after-kill, shards, and datasets that TRL and a verdict head can use."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from specagent.core.classify import classify_tools
from specagent.core.errors import EngineUnavailable
from specagent.core.types import DraftedStep, Message, StepKind, ToolCall, Trajectory
from specagent.data.datasets import finalize
from specagent.data.mine import Shard, mine_shard
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.replay import ReplayEnv
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy
from specagent.runtime.drafting import DraftSettings, live_jobs, replay_jobs, segment_stats
from specagent.runtime.labelers import match_labels, overlap_judge, prefix_closed
from tests.helpers.mining import TASKS, expert_trajectories, noisy_expert, store_jobs


@pytest.fixture(scope="module")
def store_trajectories() -> list[Trajectory]:
    return expert_trajectories(TASKS)


def dataset_rows(out_dir: Path) -> dict:
    from datasets import load_from_disk

    return {name: {split: list(ds) for split, ds in load_from_disk(str(out_dir / name)).items()}
            for name in ("segments", "drafter", "verdict")}


def mine_all(trajs, out_dir, drafter, shards=1, settings=DraftSettings()):
    for i in range(shards):
        mine_shard(trajs, drafter, store_jobs(settings), settings, out_dir / "shards", Shard(i, shards))
    finalize(trajs, out_dir / "shards", out_dir, shards, ["single_write_01"], 0.0, {}, {})
    return dataset_rows(out_dir)


class Dies(ScriptedEngine):
    def __init__(self, policy, calls):
        super().__init__(policy)
        self.left = calls

    def chat(self, requests):
        if self.left <= 0:
            raise EngineUnavailable("engine died")
        self.left -= 1
        return super().chat(requests)


def test_labels_mix_valid_and_invalid_and_are_prefix_closed(store_trajectories, tmp_path):
    rows = mine_all(store_trajectories, tmp_path, ScriptedEngine(noisy_expert(StoreEnv())))
    segments = rows["segments"]["train"] + rows["segments"]["validation"]
    labels = [label for s in segments for label in s["labels"]]
    assert 0 < sum(labels) < len(labels)
    for s in segments:
        assert s["labels"] == prefix_closed(s["labels"])
    # no task in both splits, and the explicit validation task is the only one there
    assert {s["task_id"] for s in rows["segments"]["validation"]} == {"single_write_01"}
    assert "single_write_01" not in {s["task_id"] for s in rows["segments"]["train"]}


def test_reference_segments_are_valid_verdict_rows_and_never_count_as_drafts(store_trajectories, tmp_path):
    """The strong model's own next steps, cut by the DRAFT rules, as positives for the verdict
    data; the acceptance figures and the `segments` dataset keep drafts only."""
    import json

    plain = mine_all(store_trajectories, tmp_path / "plain", ScriptedEngine(lambda *_: "Sorry, I cannot help."))
    rows = mine_all(store_trajectories, tmp_path / "ref", ScriptedEngine(lambda *_: "Sorry, I cannot help."),
                    settings=DraftSettings(reference_segments=True))
    assert rows["segments"] == plain["segments"]
    verdict = rows["verdict"]["train"] + rows["verdict"]["validation"]
    references = [r for r in verdict if r["label_source"] == "reference"]
    drafted = [r for r in verdict if r["label_source"] == "match"]
    assert references and drafted and len(drafted) == len(plain["verdict"]["train"] + plain["verdict"]["validation"])
    assert all(set(r["labels"]) == {1} for r in references) and all(set(r["labels"]) == {0} for r in drafted)
    for row in references:  # the DRAFT rules: lookups, then at most one held step, which ends it
        assert len(row["labels"]) <= DraftSettings().max_draft_steps
    stats = json.loads((tmp_path / "ref" / "stats.json").read_text())
    assert stats["reference_segments"] == len(references) and stats["all"]["accepted_steps"] == 0
    card = (tmp_path / "ref" / "README.md").read_text()  # every way a draft ended is explained in the card
    for ended in stats["all"]["ended_by"]:
        assert f"- `{ended}`: " in card


def test_killed_mid_way_rerun_gives_identical_datasets(store_trajectories, tmp_path):
    drafter = noisy_expert(StoreEnv())
    once = mine_all(store_trajectories, tmp_path / "once", ScriptedEngine(drafter))
    settings = DraftSettings()
    with pytest.raises(EngineUnavailable):
        mine_shard(store_trajectories, Dies(drafter, 7), store_jobs(settings), settings, tmp_path / "again" / "shards")
    shard_file = tmp_path / "again" / "shards" / Shard().filename
    assert 0 < len(shard_file.read_text().splitlines()) < len(store_trajectories)
    with shard_file.open("a") as f:
        f.write('{"trajectory_id": "store:multi')  # a torn line from the kill
    again = mine_all(store_trajectories, tmp_path / "again", ScriptedEngine(drafter))
    assert again == once
    ids = [s["id"] for split in again["segments"].values() for s in split]
    assert len(ids) == len(set(ids))


def test_shards_merge_into_the_single_run_dataset(store_trajectories, tmp_path):
    drafter = noisy_expert(StoreEnv())
    single = mine_all(store_trajectories, tmp_path / "one", ScriptedEngine(drafter))
    sharded = mine_all(store_trajectories, tmp_path / "three", ScriptedEngine(drafter), shards=3)
    assert sharded == single
    grouped = mine_all(store_trajectories, tmp_path / "grouped", ScriptedEngine(drafter),
                       settings=DraftSettings(batch_trajectories=4))  # several trajectories per engine batch
    assert grouped == single
    owners = [[Shard(i, 3).owns(t.id) for i in range(3)] for t in store_trajectories]
    assert all(sum(o) == 1 for o in owners)


def test_live_environment_restores_state_at_the_cut(store_trajectories):
    traj = next(t for t in store_trajectories if t.task_id == "multi_write_01")
    cuts = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    jobs = live_jobs(StoreEnv, traj, cuts, 2, classify_tools(traj.tools))
    # a lookup of the order after its first write must see the write's effect, before it not
    writes = [i for i, m in enumerate(traj.messages) if m.tool_calls and not classify_tools(traj.tools)[m.tool_calls[0].name]]
    assert writes, "the task has writes"
    order_id = traj.messages[writes[0]].tool_calls[0].arguments.get("order_id")
    lookup = ToolCall("q", "get_order_details", {"order_id": order_id})
    before = next(j for j, c in zip(jobs, cuts) if c <= writes[0]).execute(lookup).content
    after = next(j for j, c in zip(jobs, cuts) if c > writes[0]).execute(lookup).content
    assert before != after


def test_replay_mining_ends_drafts_at_unrecorded_calls(store_trajectories, tmp_path):
    replay = ReplayEnv(store_trajectories)
    settings = DraftSettings()
    drafter = ScriptedEngine(noisy_expert(StoreEnv(), every=2))
    path, _ = mine_shard(store_trajectories, drafter, lambda t, c: replay_jobs(replay, t, c, 4), settings, tmp_path)
    segments = [s for line in path.read_text().splitlines() for s in json.loads(line)["segments"]]
    stopped = [s for s in segments if s["ended_by"] == "unrecorded"]
    assert stopped  # the wrong lookup W0000 was never recorded
    assert all(s["unrecorded"] for s in stopped) and not any(s["unrecorded"] for s in segments if s not in stopped)
    # the lookup that could not run is a drafted step, never an accepted one
    stats = segment_stats(segments)
    assert stats["drafted_steps"] == sum(len(s["steps"]) for s in segments) + len(stopped)
    assert stats["accepted_steps"] == sum(sum(s["labels"]) for s in segments)
    names = {n for s in stopped for n in s["unrecorded"]}
    assert all(stats["by_tool"][n]["drafted"] > stats["by_tool"][n]["accepted"] for n in names)


def test_segment_stats_counts_an_unrecorded_lookup_as_drafted_and_rejected():
    lookup = {"kind": "read", "message": {"role": "assistant", "tool_calls": [{"function": {"name": "get_user"}}]}}
    done = {"ended_by": "held", "steps": [lookup, {"kind": "reply", "message": {"role": "assistant"}}], "labels": [1, 1]}
    cut = {"ended_by": "unrecorded", "steps": [lookup], "labels": [1], "unrecorded": ["search"]}
    old = {"ended_by": "unrecorded", "steps": [], "labels": []}  # a shard mined before the field existed
    stats = segment_stats([done, cut, old])
    assert (stats["drafted_steps"], stats["accepted_steps"]) == (5, 3)
    assert stats["acceptance_rate"] == 3 / 5 and stats["mean_accepted_prefix"] == 1.0
    assert stats["by_position"]["2"] == {"drafted": 2, "accepted": 1, "rate": 0.5}
    assert stats["by_tool"]["search"] == {"drafted": 1, "accepted": 0, "rate": 0.0}
    assert stats["by_tool"]["unrecorded"]["drafted"] == 1
    # a draft ended by a repeated lookup (draft_stop_repeats): the repeat counts, rejected, under `repeat`
    repeat = {"ended_by": "repeat", "steps": [lookup], "labels": [1]}
    stats = segment_stats([done, repeat])
    assert (stats["drafted_steps"], stats["accepted_steps"]) == (4, 3)
    assert stats["by_tool"]["repeat"] == {"drafted": 1, "accepted": 0, "rate": 0.0}


def step(message, kind):
    return DraftedStep(message, kind)


def test_match_labeler_allows_lookup_reordering_and_judges_replies():
    ro = {"get": True, "cancel": False}
    a = Message(role="assistant", tool_calls=(ToolCall("1", "get", {"id": 1}),))
    b = Message(role="assistant", tool_calls=(ToolCall("2", "get", {"id": 2.0}),))
    w = Message(role="assistant", tool_calls=(ToolCall("3", "cancel", {"id": 1}),))
    reference = [a, b, w]
    drafted = [step(Message(role="assistant", tool_calls=(ToolCall("9", "get", {"id": 2}),)), StepKind.READ),
               step(a, StepKind.READ), step(w, StepKind.WRITE)]
    assert match_labels(drafted, reference, ro) == [1, 1, 1]
    wrong_args = step(Message(role="assistant", tool_calls=(ToolCall("3", "cancel", {"id": 7}),)), StepKind.WRITE)
    assert match_labels([step(a, StepKind.READ), wrong_args], reference, ro) == [1, 0]
    assert match_labels([step(w, StepKind.WRITE), step(a, StepKind.READ)], [w, a], ro) == [1, 0]
    assert overlap_judge("Order W1007 is delivered.", "Your order W1007 has been delivered.")
    assert not overlap_judge("Order W1008 is delivered.", "Your order W1007 has been delivered.")


@pytest.mark.slow
def test_sft_trainer_loads_the_drafter_dataset_as_is(store_trajectories, tmp_path):
    """TRL's SFTTrainer takes the drafter set unchanged and trains on assistant tokens only."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    from specagent.engines.models import materialize
    from specagent.engines.render import load_template

    mine_all(store_trajectories, tmp_path, ScriptedEngine(noisy_expert(StoreEnv())))
    data = load_from_disk(str(tmp_path / "drafter"))
    tokenizer = AutoTokenizer.from_pretrained(materialize("smollm2"))
    tokenizer.chat_template = load_template()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    model = LlamaForCausalLM(config)
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=2, per_device_train_batch_size=1,
                     assistant_only_loss=True, max_length=2048, report_to=[], save_strategy="no", use_cpu=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data["train"], processing_class=tokenizer)
    row = trainer.train_dataset[0]
    masked = [t for t in row["labels"] if t != -100]  # TRL turns the assistant mask into labels
    text = tokenizer.decode(masked)
    assert "<tool_call>" in text and "You are an online store" not in text  # targets: assistant turns only
    result = trainer.train()
    assert result.global_step == 2


@pytest.mark.slow
def test_verdict_labels_sit_exactly_on_step_boundaries(store_trajectories, tmp_path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from specagent.engines.models import materialize
    from specagent.train.verdict import IGNORE, token_labels

    mine_all(store_trajectories, tmp_path, ScriptedEngine(noisy_expert(StoreEnv())))
    verdict = load_from_disk(str(tmp_path / "verdict"))["train"]
    example = max(verdict, key=lambda r: len(r["labels"]))
    assert len(example["labels"]) >= 2
    tokenizer = AutoTokenizer.from_pretrained(materialize("smollm2"))
    out = token_labels(tokenizer, example)
    marked = [i for i, label in enumerate(out["labels"]) if label != IGNORE]
    assert [out["labels"][i] for i in marked] == example["labels"]
    for position, index in zip(marked, example["step_message_indices"]):
        assert tokenizer.decode(out["input_ids"][position]) == "<|im_end|>"
        step = example["messages"][index]
        before = tokenizer.decode(out["input_ids"][position - 12: position])
        expected_tail = "</tool_call>" if step.get("tool_calls") else (step["content"] or "")[-8:]
        assert before.endswith(expected_tail), (before, expected_tail)
        # the token before the closing one belongs to the drafted step, the one after starts the next turn
        assert tokenizer.decode(out["input_ids"][position + 1: position + 3]).startswith("\n<|im_start|>")


def test_judge_labeler_uses_the_strong_verdict_with_the_reference_shown():
    from specagent.runtime.labelers import judge_labels

    seen = []

    def strong(messages, tools):
        seen.append(messages[-1].content)
        return "1"

    a = Message(role="assistant", tool_calls=(ToolCall("1", "get", {"id": 1}),))
    obs = (Message(role="tool", content="{}", tool_call_id="1"),)
    steps = [DraftedStep(a, StepKind.READ, obs), DraftedStep(a, StepKind.READ, obs)]
    [(labels, usage, raw)] = judge_labels(ScriptedEngine(strong), [([Message("user", "hi")], steps, [a])], [])
    assert labels == [1, 0] and raw == "1"
    assert "a strong agent's next steps here were" in seen[0] and "call get({'id': 1})" in seen[0]


def test_rollout_labeler_scores_drafted_prefixes_by_the_environment_reward(store_trajectories):
    from specagent.runtime.drafting import restore
    from specagent.runtime.labelers import rollout_labels

    traj = next(t for t in store_trajectories if t.task_id == "single_write_01")
    read_only = classify_tools(traj.tools)
    cut = next(i for i, m in enumerate(traj.messages) if m.tool_calls and not read_only[m.tool_calls[0].name])
    expert = ScriptedEngine(expert_policy(StoreEnv()))
    right = DraftedStep(traj.messages[cut], StepKind.WRITE)
    order = traj.messages[cut].tool_calls[0].arguments["order_id"]
    other = next(o for o in ("W1001", "W1002", "W1003") if o != order)
    wrong_call = ToolCall("x", "cancel_pending_order", {"order_id": other, "reason": "no longer needed"})
    wrong = DraftedStep(Message(role="assistant", tool_calls=(wrong_call,)), StepKind.WRITE)

    def restore_env():
        return restore(StoreEnv, traj, cut, read_only)

    labels, rewards = rollout_labels(restore_env, traj.task_id, traj.messages[:cut], [right], expert)
    assert labels == [1] and rewards == [1.0, 1.0]
    labels, rewards = rollout_labels(restore_env, traj.task_id, traj.messages[:cut], [wrong], expert)
    assert labels == [0] and rewards[0] == 1.0 and rewards[1] == 0.0

    # a strong model that fails from the cut point anyway (it only says goodbye): the baseline is
    # 0, and a wrong write, which also scores 0, is still invalid (as well as the baseline is not
    # enough: the rollout must solve the task); with min_reward 0 it would be valid
    def quitter(messages, tools):
        return Message(role="assistant", content="Goodbye.")

    labels, rewards = rollout_labels(restore_env, traj.task_id, traj.messages[:cut], [wrong], ScriptedEngine(quitter))
    assert rewards == [0.0, 0.0] and labels == [0]
    labels, _ = rollout_labels(restore_env, traj.task_id, traj.messages[:cut], [wrong], ScriptedEngine(quitter),
                               min_reward=0.0)
    assert labels == [1]
    labels, rewards = rollout_labels(restore_env, traj.task_id, traj.messages[:cut], [right], ScriptedEngine(quitter))
    assert labels == [int(rewards[1] >= 1.0)] and rewards[0] == 0.0  # the right write can rescue the cut


def recovering_expert():
    """The store expert, reading past its own detours: a call that failed or repeats an earlier
    one is dropped from what it reads, so it goes on with its plan one step later."""
    policy = expert_policy(StoreEnv())

    def act(messages, tools):
        kept, seen, i = [], set(), 0
        while i < len(messages):
            m = messages[i]
            if m.role == "assistant" and m.tool_calls:
                results = messages[i + 1: i + 1 + len(m.tool_calls)]
                key = tuple((c.name, json.dumps(c.arguments, sort_keys=True)) for c in m.tool_calls)
                if key in seen or any((r.content or "").startswith("Error") for r in results):
                    i += 1 + len(results)
                    continue
                seen.add(key)
            kept.append(m)
            i += 1
        return policy(kept, tools)

    return ScriptedEngine(act)


def test_rollout_max_extra_steps_calls_a_recovered_detour_invalid(store_trajectories):
    """A drafted lookup that fails (an order that does not exist): the strong model goes on and
    solves the task, one step later than alone. Without `max_extra_steps` the detour is valid;
    with 0 it is not, with 1 it is, and the expert's own lookup there is valid with 0. The same
    lookup drafted twice: the first valid, the repeat not."""
    from specagent.runtime.drafting import restore
    from specagent.runtime.labelers import rollout_labels

    traj = next(t for t in store_trajectories if t.task_id == "lookups_then_write_01")
    read_only = classify_tools(traj.tools)
    cut = next(i for i, m in enumerate(traj.messages)
               if m.tool_calls and m.tool_calls[0].name == "get_order_details")
    strong = recovering_expert()

    def restore_env():
        return restore(StoreEnv, traj, cut, read_only)

    def labels_of(steps, **kwargs):
        return rollout_labels(restore_env, traj.task_id, traj.messages[:cut], steps, strong, **kwargs)

    call = ToolCall("x", "get_order_details", {"order_id": "W0000"})
    failed = Message(role="tool", content=restore_env().execute(call), tool_call_id="x", name=call.name)
    assert failed.content.startswith("Error")
    detour = DraftedStep(Message(role="assistant", tool_calls=(call,)), StepKind.READ, (failed,))
    right = DraftedStep(traj.messages[cut], StepKind.READ, (traj.messages[cut + 1],))

    assert labels_of([detour]) == ([1], [1.0, 1.0])  # the task is solved either way
    assert labels_of([detour], max_extra_steps=0)[0] == [0]
    assert labels_of([detour], max_extra_steps=1)[0] == [1]
    assert labels_of([right], max_extra_steps=0)[0] == [1]
    assert labels_of([right, right], max_extra_steps=0)[0] == [1, 0]
    assert labels_of([right, right])[0] == [1, 1]


def test_rollout_failed_calls_invalid_calls_a_failed_lookup_invalid_at_no_step_cost(store_trajectories):
    """The plain store expert takes a failed lookup in place of one of its own (it counts its
    lookups): the task is solved in as many steps as alone, so neither the reward nor
    `max_extra_steps` tells the detour apart; `failed_calls_invalid` does, and keeps the
    expert's own lookup valid."""
    from specagent.runtime.drafting import restore
    from specagent.runtime.labelers import rollout_labels

    traj = next(t for t in store_trajectories if t.task_id == "lookups_then_write_01")
    read_only = classify_tools(traj.tools)
    cut = next(i for i, m in enumerate(traj.messages)
               if m.tool_calls and m.tool_calls[0].name == "get_order_details")
    strong = ScriptedEngine(expert_policy(StoreEnv()))

    def restore_env():
        return restore(StoreEnv, traj, cut, read_only)

    def labels_of(steps, **kwargs):
        return rollout_labels(restore_env, traj.task_id, traj.messages[:cut], steps, strong, **kwargs)[0]

    call = ToolCall("x", "get_order_details", {"order_id": "W0000"})
    failed = Message(role="tool", content=restore_env().execute(call), tool_call_id="x", name=call.name)
    detour = DraftedStep(Message(role="assistant", tool_calls=(call,)), StepKind.READ, (failed,))
    right = DraftedStep(traj.messages[cut], StepKind.READ, (traj.messages[cut + 1],))
    assert labels_of([detour], max_extra_steps=0) == [1]
    assert labels_of([detour], failed_calls_invalid=True) == [0]
    assert labels_of([right, detour], failed_calls_invalid=True) == [1, 0]
    assert labels_of([right], failed_calls_invalid=True, max_extra_steps=0) == [1]


def test_rollouts_run_side_by_side_give_the_one_at_a_time_labels_in_fewer_engine_calls(store_trajectories):
    """Every rollout of every segment, 8 at a time with the strong model's requests batched:
    the same labels and rewards as one at a time, a right and a wrong held write told apart in
    each trajectory, no rollout after a failed prefix, and the requests batched."""
    from specagent.runtime.drafting import restore
    from specagent.runtime.labelers import RolloutJob, rollout_labels_many

    jobs, expected = [], []
    for traj in store_trajectories:
        read_only = classify_tools(traj.tools)
        cut = next((i for i, m in enumerate(traj.messages) if m.tool_calls and not read_only[m.tool_calls[0].name]),
                   None)
        if cut is None or traj.messages[cut].tool_calls[0].name != "cancel_pending_order":
            continue
        right = DraftedStep(traj.messages[cut], StepKind.WRITE)
        order = traj.messages[cut].tool_calls[0].arguments["order_id"]
        other = next(o for o in ("W1001", "W1002", "W1003") if o != order)
        wrong = DraftedStep(Message(role="assistant", tool_calls=(
            ToolCall("x", "cancel_pending_order", {"order_id": other, "reason": "no longer needed"}),)), StepKind.WRITE)
        for steps, labels in (([right], [1]), ([wrong], [0]), ([right, wrong], [1, 0]), ([wrong, right], [0, 0])):
            jobs.append(RolloutJob(lambda t=traj, c=cut, r=read_only: restore(StoreEnv, t, c, r), traj.task_id,
                                   traj.messages[:cut], steps))
            expected.append(labels)
    assert len(jobs) >= 6
    one_at_a_time = ScriptedEngine(expert_policy(StoreEnv()))
    sequential = rollout_labels_many(jobs, one_at_a_time)
    batched_engine, batches = ScriptedEngine(expert_policy(StoreEnv())), []
    chat = batched_engine.chat
    batched_engine.chat = lambda requests: batches.append(len(requests)) or chat(requests)
    done = []
    side_by_side = rollout_labels_many(jobs, batched_engine, concurrency=8, on_done=lambda: done.append(1))
    assert [labels for labels, _ in sequential] == expected
    assert side_by_side == sequential
    assert len(done) == sum(len(job.steps) + 1 for job in jobs)
    after_a_failed_step = [rewards[2] for (labels, rewards), job in zip(sequential, jobs) if len(job.steps) == 2
                           and labels == [0, 0]]
    assert after_a_failed_step and set(after_a_failed_step) == {None}  # prefix-closed: not rolled out
    assert sum(batches) == one_at_a_time.calls and max(batches) > 1, "the rollouts' requests were not batched"


def test_mining_with_rollout_labels_runs_every_segments_rollouts_together(store_trajectories, tmp_path):
    """`specagent mine` with `labelers: [rollout, match]`: the rollouts of all the segments of a
    batch of trajectories run side by side; each segment gets both labels, rollout first, and a
    drafted step `match` finds valid is valid by rollout too (the expert's own step)."""
    from specagent.runtime.drafting import restore

    settings = DraftSettings(labelers=("rollout", "match"), rollout_concurrency=4, batch_trajectories=3)

    def restore_for(traj, cut):
        return lambda: restore(StoreEnv, traj, cut, classify_tools(traj.tools))

    drafter = ScriptedEngine(noisy_expert(StoreEnv()))
    strong = ScriptedEngine(expert_policy(StoreEnv()))
    path, _ = mine_shard(store_trajectories[:3], drafter, store_jobs(settings), settings, tmp_path, Shard(0, 1),
                      strong, restore_for)
    segments = [seg for line in path.read_text().splitlines() for seg in json.loads(line)["segments"]]
    assert segments and all(r["label_source"] == "rollout" for r in segments)
    assert all(len(r["all_labels"]["rollout"]) == len(r["steps"]) == len(r["all_labels"]["match"]) for r in segments)
    pairs = [(m, r) for seg in segments for m, r in zip(seg["all_labels"]["match"], seg["all_labels"]["rollout"])]
    assert any(m for m, _ in pairs) and all(r for m, r in pairs if m)


def test_a_drafter_adapter_given_by_path_is_registered_on_the_drafter_engine(tmp_path):
    from specagent.config import MineConfig
    from specagent.runtime.assembly import resolve_adapter

    def drafter_engine(cfg):  # what `specagent mine` does with its drafter
        return resolve_adapter(cfg.drafter, cfg.drafter_adapter, "drafter")

    (tmp_path / "run" / "adapter").mkdir(parents=True)
    (tmp_path / "run" / "adapter" / "adapter_config.json").write_text("{}")
    cfg = MineConfig(trajectories="t.jsonl", drafter_adapter=str(tmp_path / "run"))
    engine, name = drafter_engine(cfg)
    assert name == "drafter" and engine.adapters == {"drafter": str(tmp_path / "run" / "adapter")}
    named = MineConfig(trajectories="t.jsonl", drafter={"adapters": {"mine": "x"}}, drafter_adapter="mine")
    assert drafter_engine(named) == (named.drafter, "mine")


class UnsureOfReplies(ScriptedEngine):
    """The expert, except that it is unsure of every reply it starts when asked to stop there."""

    def __init__(self):
        super().__init__(expert_policy(StoreEnv()))
        self.stop_below: set[float] = set()

    def chat(self, requests):
        out = super().chat(requests)
        self.stop_below |= {r.stop_below for r in requests}
        return [replace(c, text=c.text[:5], finish_reason="unsure") if r.stop_below and not c.message.tool_calls
                else c for r, c in zip(requests, out)]


@pytest.mark.parametrize("stop_below", [0.0, 0.3])
def test_mining_drafts_under_the_runtimes_stop_rule(store_trajectories, tmp_path, stop_below):
    """A mine config's protocol.draft_stop_below reaches the drafter as the runtime sends it: an
    unfinished step ends the draft and is not a drafted step (offline acceptance counts what the
    runtime would draft)."""
    from specagent.config import EnvConfig, MineConfig, ProtocolSettings
    from specagent.runtime.drafting import draft_settings

    mine = MineConfig(trajectories="unused.jsonl", env=EnvConfig(name="store"),
                      protocol=ProtocolSettings(max_draft_steps=4, draft_stop_below=stop_below))
    settings = draft_settings(mine, drafter_adapter=None)
    assert settings.draft_stop_below == stop_below
    drafter = UnsureOfReplies()
    path, _ = mine_shard(store_trajectories, drafter, store_jobs(settings), settings, tmp_path)
    segments = [s for line in path.read_text().splitlines() for s in json.loads(line)["segments"]]
    assert drafter.stop_below == {stop_below}
    unsure = [s for s in segments if s["ended_by"] == "unsure"]
    replies = [s for s in segments if s["steps"] and s["steps"][-1]["kind"] == "reply"]
    if stop_below:
        assert unsure and not replies  # every reply was left unfinished: none is a drafted step
    else:
        assert replies and not unsure
    assert segment_stats(segments)["drafted_steps"] == sum(len(s["steps"]) for s in segments)
