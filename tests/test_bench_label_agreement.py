"""bench/label_agreement.py: two labelers' labels of the same mined drafts, counted by tool."""

from __future__ import annotations

from specagent.core.classify import classify_tools
from specagent.data.mine import Shard, mine_shard
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy
from specagent.runtime.drafting import DraftSettings, restore
from tests.helpers.bench import load_bench
from tests.helpers.mining import TASKS, expert_trajectories, noisy_expert, store_jobs

bench = load_bench("label_agreement")


def test_counts_add_up_per_tool_and_a_step_match_accepts_is_valid_by_rollout(tmp_path):
    """Drafts of a noisy expert at the expert's runs, labeled by rollout (the expert continuing)
    and match: every row adds up, the `all` row is the sum of the tools', and every step `match`
    finds equal to the expert's is one the expert's rollout also solves from."""
    trajectories = expert_trajectories(TASKS[:4])
    settings = DraftSettings(labelers=("rollout", "match"), rollout_concurrency=4, batch_trajectories=4)
    mine_shard(trajectories, ScriptedEngine(noisy_expert(StoreEnv())), store_jobs(settings), settings,
               tmp_path / "shards", Shard(0, 1), ScriptedEngine(expert_policy(StoreEnv())),
               lambda traj, cut: lambda: restore(StoreEnv, traj, cut, classify_tools(traj.tools)))
    table = bench.agreement(bench.segments_of(tmp_path), "rollout", "match")
    total = table.pop("all")
    assert total["drafted"] == sum(row["drafted"] for row in table.values()) > 0
    for row in [*table.values(), total]:
        assert row.get("only_match", 0) == 0  # the expert's own step never hurts the expert's outcome
        assert row.get("both", 0) + row.get("only_rollout", 0) == row.get("rollout", 0) <= row["drafted"]
    assert "reply" in table or "get_order_details" in table
