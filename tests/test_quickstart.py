"""`specagent quickstart`: stages run as real `specagent` processes, in order; a stage whose
output exists is skipped (so a rerun resumes); a failing stage stops the pipeline with a
message naming it; `--fresh` removes every stage's output first. Scripted models only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specagent.core.errors import ConfigError, SpecAgentError
from specagent.quickstart import run_pipeline


def write_pipeline(tmp_path: Path, eval_env: dict) -> Path:
    (tmp_path / "collect.yaml").write_text(yaml.safe_dump({
        "env": {"name": "store", "limit": 2}, "strong": {"backend": "scripted", "script": "expert"},
        "output": str(tmp_path / "demos.jsonl")}))
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump({
        "env": eval_env, "strong": {"backend": "scripted", "script": "expert"},
        "weak": {"backend": "scripted", "script": "expert"},
        "arms": [{"name": "strong", "mode": "strong"}, {"name": "weak", "mode": "weak"}],
        "output_dir": str(tmp_path / "eval")}))
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump({"stages": [{"command": "collect", "config": "collect.yaml"},
                                                   {"command": "eval", "config": "eval.yaml"}]}))
    return pipeline


def test_stages_run_in_order_then_a_rerun_skips_them_and_fresh_starts_over(tmp_path):
    pipeline = write_pipeline(tmp_path, {"name": "store", "limit": 2})
    first = run_pipeline(pipeline, out=tmp_path)
    assert [s["skipped"] for s in first["stages"]] == [False, False]
    assert len((tmp_path / "demos.jsonl").read_text().splitlines()) == 2
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert set(report["arms"]) == {"strong", "weak"}
    assert json.loads((tmp_path / "timings.json").read_text())["stages"][0]["stage"].startswith("collect")

    assert [s["skipped"] for s in run_pipeline(pipeline, out=tmp_path)["stages"]] == [True, True]
    (tmp_path / "demos.jsonl").write_text("")  # --fresh must remove it, and rebuild it
    assert [s["skipped"] for s in run_pipeline(pipeline, fresh=True, out=tmp_path)["stages"]] == [False, False]
    assert len((tmp_path / "demos.jsonl").read_text().splitlines()) == 2


def test_a_failing_stage_stops_the_pipeline_and_names_itself(tmp_path):
    pipeline = write_pipeline(tmp_path, {"name": "store", "task_ids": ["no_such_task"]})
    with pytest.raises(SpecAgentError, match=r"stage 2 \(eval"):
        run_pipeline(pipeline, out=tmp_path)
    assert (tmp_path / "demos.jsonl").is_file() and not (tmp_path / "eval" / "report.md").exists()
    failed = json.loads((tmp_path / "timings.json").read_text())  # what ran is kept, and what failed
    assert failed["failed"].startswith("eval") and [s["skipped"] for s in failed["stages"]] == [False, False]

    write_pipeline(tmp_path, {"name": "store", "limit": 2})  # fixed: the rerun resumes at the eval
    resumed = run_pipeline(tmp_path / "pipeline.yaml", out=tmp_path)
    assert [s["skipped"] for s in resumed["stages"]] == [True, False] and resumed["failed"] is None
    assert resumed["stages"][0]["earlier_seconds"] == failed["stages"][0]["seconds"] > 0


def test_an_import_stage_writes_trajectories_and_timings_go_to_the_pipelines_output_dir(tmp_path):
    log = tmp_path / "chats.jsonl"
    log.write_text("".join(json.dumps({"id": f"c{n}", "task_id": f"t{n}", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]}) + "\n" for n in range(3)))
    out = tmp_path / "runs" / "trajectories.jsonl"
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "runs"), "stages": [
        {"command": "import", "inputs": [str(log)], "to": str(out), "model": "gpt-x"}]}))
    first = run_pipeline(pipeline)
    assert [json.loads(line)["model"] for line in out.read_text().splitlines()] == ["gpt-x"] * 3
    assert json.loads((tmp_path / "runs" / "timings.json").read_text())["stages"][0]["stage"] == f"import {out}"
    assert first["stages"][0]["skipped"] is False and run_pipeline(pipeline)["stages"][0]["skipped"] is True

    pipeline.write_text(yaml.safe_dump({"stages": [{"command": "import", "to": str(out)}]}))
    with pytest.raises(ConfigError, match="an import stage needs `inputs` and `to`"):
        run_pipeline(pipeline)


def test_the_quickstart_keeps_its_eval_tasks_out_of_training():
    """S and the drafter learn from the training split; the eval runs the eval split's tasks of
    the same kinds (the store's splits share no user, order or held-out wording)."""
    from specagent.config import CollectConfig, DrafterTrainConfig, EvalConfig, load_config
    from specagent.envs.store import StoreEnv
    from specagent.runtime.assembly import select_tasks

    base = Path(__file__).resolve().parents[1] / "configs" / "quickstart"
    collect, evaluate = load_config(CollectConfig, base / "collect.yaml"), load_config(EvalConfig, base / "eval.yaml")
    assert (collect.env.split, evaluate.env.split) == ("train", "eval") and collect.env.kinds == evaluate.env.kinds
    for name in ("strong.yaml", "drafter.yaml"):
        assert load_config(DrafterTrainConfig, base / name).dataset == collect.output
    evaluated = select_tasks(StoreEnv(split="eval"), evaluate.env)
    assert len(evaluated) == 2 * len(evaluate.env.kinds) and all(t.startswith("eval-") for t in evaluated)
