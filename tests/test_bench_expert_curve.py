"""bench/expert_curve.py: which eval tasks each checkpoint of S is run on."""

from argparse import Namespace
from pathlib import Path

from specagent.envs.store import StoreEnv
from tests.helpers.bench import load_bench

ROOT = Path(__file__).resolve().parents[1]


def test_the_curve_runs_the_eval_configs_kinds_with_generated_tasks_per_kind():
    curve = load_bench("expert_curve")
    quickstart = str(ROOT / "configs" / "quickstart" / "eval.yaml")
    tasks = curve.eval_tasks(Namespace(config=quickstart, per_kind=8))
    kinds = {"status", "tracking", "total", "item_price", "return_status", "cancel", "address", "refuse_cancel"}
    assert len(tasks) == 64 == len(set(tasks))
    assert {t.split("-")[1] for t in tasks} == kinds and all(t.startswith("eval-") for t in tasks)
    assert len(curve.eval_tasks(Namespace(config=quickstart, per_kind=None))) == 16
    # a config naming no kinds: the whole eval split, as before --per-kind existed
    everything = str(ROOT / "configs" / "eval" / "store_expert_vllm.yaml")
    assert curve.eval_tasks(Namespace(config=everything, per_kind=None)) == StoreEnv(split="eval").task_ids()
