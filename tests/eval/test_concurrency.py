"""run_tasks(concurrency=N): episodes side by side on their own environments, their
requests batched in shared engines, with the same records as one at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specagent.config import RunConfig, load_config
from specagent.core.errors import EngineUnavailable
from specagent.core.protocol import Models, ProtocolConfig
from specagent.core.verify import GenerativeVerifier
from specagent.engines.batching import batching_engines
from specagent.engines.scripted import ScriptedEngine
from specagent.runtime.episodes import read_episodes, run_tasks
from specagent.runtime.run import run_from_config
from tests.core.toy import ToyEnv, random_policy

TASKS = [f"t{i}" for i in range(16)]
CONFIG = ProtocolConfig(max_draft_steps=3, max_steps=8)
REPO = Path(__file__).resolve().parents[2]


class ManyTasks(ToyEnv):
    def task_ids(self) -> list[str]:
        return TASKS


class Recording(ScriptedEngine):
    """A scripted engine that records the batch size of every call; it fails on the
    requests of `broken_task` (an engine crash tied to one episode's prompt)."""

    def __init__(self, policy, name: str, broken_task: str | None = None) -> None:
        super().__init__(policy, name, latency_s=0.002)
        self.sizes: list[int] = []
        self.broken_task = broken_task

    def chat(self, requests):
        self.sizes.append(len(requests))
        if any(r.messages[1].content == f"task {self.broken_task}" for r in requests):
            raise EngineUnavailable(f"the engine crashed on task {self.broken_task}")
        return super().chat(requests)


def models(batched: bool, broken_task: str | None = None) -> tuple[Models, Recording, Recording]:
    """Random (seeded) weak and strong models; the generative verdict comes from the strong one."""
    strong = Recording(random_policy(2), "strong", broken_task)
    weak = Recording(random_policy(1, allow_malformed=False), "weak", broken_task)
    engines = batching_engines({"strong": strong, "weak": weak}) if batched else {"strong": strong, "weak": weak}
    verifier = GenerativeVerifier(engines["strong"])
    return Models(strong=engines["strong"], weak=engines["weak"], verifier=verifier), strong, weak


def without_timings(record: dict) -> dict:
    record = json.loads(json.dumps(record))
    del record["wall_seconds"], record["env_seconds"]
    for roles in record["ledger"].values():
        for stats in roles.values():
            del stats["seconds"]
    return record


def by_key(records: list[dict]) -> dict[tuple, dict]:
    return {(r["task_id"], r["mode"], r["trial"]): without_timings(r) for r in records}


def test_concurrent_episodes_batch_and_give_the_records_of_one_at_a_time(tmp_path):
    one, _, _ = models(batched=False)
    alone = run_tasks(ManyTasks(), TASKS, ["specagent"], one, CONFIG, tmp_path / "c1.jsonl")
    for concurrency in (4, 16):
        shared, strong, weak = models(batched=True)
        out = tmp_path / f"c{concurrency}.jsonl"
        records = run_tasks(ManyTasks(), TASKS, ["specagent"], shared, CONFIG, out,
                            concurrency=concurrency, env_factory=ManyTasks)
        assert max(strong.sizes) > 1 and max(weak.sizes) > 1
        assert max(strong.sizes + weak.sizes) <= concurrency
        assert shared.strong.stats.mean_batch > 1
        assert by_key(records) == by_key(alone)
        assert by_key(read_episodes(out)) == by_key(alone)  # whole lines, every episode once


def test_an_engine_error_stops_the_run_keeps_finished_episodes_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "episodes.jsonl"
    failing, _, _ = models(batched=True, broken_task="t5")
    with pytest.raises(EngineUnavailable, match="task t5"):
        run_tasks(ManyTasks(), TASKS, ["weak"], failing, CONFIG, out, concurrency=4, env_factory=ManyTasks)
    kept = [json.loads(line)["task_id"] for line in out.read_text().splitlines()]  # every line whole
    assert len(kept) >= 2 and "t5" not in kept  # t5 starts only after two episodes finished
    healthy, _, _ = models(batched=True)
    records = run_tasks(ManyTasks(), TASKS, ["weak"], healthy, CONFIG, out, concurrency=4, env_factory=ManyTasks)
    assert sorted(r["task_id"] for r in records) == sorted(TASKS)
    assert sorted(r["task_id"] for r in read_episodes(out)) == sorted(TASKS)


def test_concurrency_needs_an_environment_per_thread(tmp_path):
    shared, _, _ = models(batched=True)
    with pytest.raises(ValueError, match="env_factory"):
        run_tasks(ManyTasks(), TASKS, ["weak"], shared, CONFIG, tmp_path / "e.jsonl", concurrency=2)


def test_run_from_config_reports_throughput_and_batches(tmp_path):
    def run(concurrency: int) -> tuple[dict, list[dict]]:
        out = tmp_path / f"c{concurrency}"
        cfg = load_config(RunConfig, REPO / "configs/run/store_scripted.yaml",
                          [f"concurrency={concurrency}", f"output_dir={out}", "env.limit=8"])
        return run_from_config(cfg)["specagent"], read_episodes(out / "episodes.jsonl")

    single, single_records = run(1)
    summary, records = run(4)
    rate = summary["throughput"]
    assert rate["concurrency"] == 4 and rate["episodes"] == 8 and rate["episodes_per_min"] > 0
    (engine,) = rate["engines"]  # both roles share the one scripted engine
    assert engine["roles"] == ["strong", "weak"] and engine["mean_batch"] > 1
    assert single["throughput"]["engines"] == []  # concurrency 1: the engines are not wrapped
    assert by_key(records) == by_key(single_records)
