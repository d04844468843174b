"""`executor.kind: ray` (`--ray`) for mine, collect and eval, on a real local Ray cluster
started here (2 CPUs): the output equals the single-process output, an actor that dies
mid-run loses and duplicates nothing, and a driver killed mid-run resumes. Scripted
engines only, so "equal" means equal, timings aside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specagent.cli import main
from specagent.config import CollectConfig, EvalConfig, MineConfig, load_config
from specagent.core.errors import SpecAgentError
from specagent.data.stage import collect_from_config, mine_from_config
from specagent.eval.matrix import eval_from_config
from specagent.records.trajectories import write_trajectories
from specagent.runtime.episodes import read_episodes
from specagent.runtime.ray_episodes import EpisodeWorker
from tests.helpers.mining import TASKS, expert_trajectories
from tests.helpers.ray_workers import NoisyMineWorker, dying

ray = pytest.importorskip("ray")  # the `ray` extra (in `dev`, so CI has it)

ROOT = Path(__file__).resolve().parents[1]
EVAL_CONFIG = ROOT / "configs" / "eval" / "store_scripted.yaml"
RAY = {"kind": "ray", "actors": 2, "num_cpus": 1}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster():
    """A 2-CPU local cluster whose workers import this checkout's specagent and tests."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                       runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield context
    ray.shutdown()


@pytest.fixture(scope="module")
def trajectories_file(tmp_path_factory) -> Path:
    """The store expert's runs of six tasks, as `specagent collect` writes them."""
    out = expert_trajectories(TASKS)
    path = tmp_path_factory.mktemp("trajectories") / "trajectories.jsonl"
    write_trajectories(path, out)
    return path


def mine_config(trajectories: Path, out: Path, **executor) -> MineConfig:
    return MineConfig(trajectories=str(trajectories), output_dir=str(out), drafter={"backend": "scripted"},
                      env={"name": "store"}, validation_tasks=["single_write_01"], batch_trajectories=2,
                      executor=executor or {"kind": "local"})


def datasets(out: Path) -> dict:
    """Every row of the three datasets, and stats.json but its timings, output dir and executor."""
    from datasets import load_from_disk

    rows = {name: {split: list(ds) for split, ds in load_from_disk(str(out / name)).items()}
            for name in ("segments", "drafter", "verdict")}
    stats = json.loads((out / "stats.json").read_text())
    del stats["seconds_in_engines"], stats["wall_seconds"], stats["config"]["output_dir"], stats["config"]["executor"]
    return {"rows": rows, "stats": stats}


def shard_ids(out: Path) -> list[str]:
    return [json.loads(line)["trajectory_id"] for line in (out / "shards" / "shard-000-of-001.jsonl").open()]


@pytest.fixture(scope="module")
def mined_here(trajectories_file, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("mined-here")
    mine_from_config(mine_config(trajectories_file, out), worker=NoisyMineWorker)
    return datasets(out)


def test_mining_on_two_actors_equals_one_process(cluster, trajectories_file, mined_here, tmp_path):
    mine_from_config(mine_config(trajectories_file, tmp_path, **RAY), worker=NoisyMineWorker)
    assert datasets(tmp_path) == mined_here
    labels = [x for s in mined_here["rows"]["segments"]["train"] for x in s["labels"]]
    assert 0 < sum(labels) < len(labels)  # the noisy drafter: something to get wrong
    assert sorted(shard_ids(tmp_path)) == sorted(f"store:{t}:0" for t in TASKS)


def test_an_actor_dying_mid_mine_loses_and_duplicates_nothing(cluster, trajectories_file, mined_here, tmp_path,
                                                                capsys):
    marker = tmp_path / "died"
    worker = dying(NoisyMineWorker, marker, "mine", at_call=2)  # dies running its second group
    mine_from_config(mine_config(trajectories_file, tmp_path / "out", **RAY), worker=worker)
    assert marker.read_text().isdigit()  # an actor's process did exit mid-run
    assert "actors lost 1, items resubmitted 1" in capsys.readouterr().out
    ids = shard_ids(tmp_path / "out")
    assert len(ids) == len(set(ids)) == len(TASKS)
    assert datasets(tmp_path / "out") == mined_here


def test_a_killed_driver_resumes_into_the_same_datasets(cluster, trajectories_file, mined_here, tmp_path):
    """The driver is a real process that joins this cluster by its address (executor.address),
    SIGKILLed once it has written some groups; the rerun mines only what is missing."""
    out = tmp_path / "out"
    script = "import sys; from tests.helpers.ray_workers import drive_slow_mine; drive_slow_mine(sys.argv[1])"
    joining = mine_config(trajectories_file, out, **RAY, address=cluster.address_info["gcs_address"])
    (tmp_path / "cfg.json").write_text(joining.model_dump_json())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    driver = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "cfg.json")], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    shard = out / "shards" / "shard-000-of-001.jsonl"
    deadline = time.monotonic() + 120
    while not (shard.exists() and len(shard.read_text().splitlines()) >= 2):
        assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    before = shard_ids(out)
    assert 2 <= len(before) < len(TASKS)  # killed mid-run
    mine_from_config(mine_config(trajectories_file, out, **RAY), worker=NoisyMineWorker)
    ids = shard_ids(out)
    assert ids[: len(before)] == before and len(ids) == len(set(ids)) == len(TASKS)
    assert datasets(out) == mined_here


def without_timings(record: dict) -> dict:
    record = json.loads(json.dumps(record))
    del record["wall_seconds"], record["env_seconds"]
    for roles in record["ledger"].values():
        for stats in roles.values():
            del stats["seconds"]
    return record


def by_key(path: Path) -> dict[tuple, dict]:
    records = read_episodes(path)
    keyed = {(r["task_id"], r["arm"], r["trial"]): without_timings(r) for r in records}
    assert len(keyed) == len(records)  # no episode twice
    return keyed


def eval_config(out: Path, **executor) -> EvalConfig:
    return load_config(EvalConfig, EVAL_CONFIG, [f"output_dir={out}", "env.limit=4", "trials=2",
                                                 f"executor={json.dumps(executor or {'kind': 'local'})}"])


@pytest.fixture(scope="module")
def evaluated_here(tmp_path_factory) -> tuple[dict, dict]:
    out = tmp_path_factory.mktemp("eval-here")
    report = eval_from_config(eval_config(out))
    return by_key(out / "episodes.jsonl"), report


def successes(report: dict) -> dict[str, float]:
    return {label: arm["success"] for label, arm in report["arms"].items()}


@pytest.mark.parametrize("concurrency", [1, 3])
def test_eval_on_ray_equals_one_process(cluster, evaluated_here, tmp_path, concurrency):
    """Through the CLI; at concurrency 3 each actor runs 3 episodes side by side, any arms,
    their requests batched in its engines."""
    episodes, report = evaluated_here
    assert len(episodes) == 4 * 4 * 2  # tasks x arms x trials
    assert main(["eval", "-c", str(EVAL_CONFIG), "--ray", f"output_dir={tmp_path}", "env.limit=4", "trials=2",
                 f"concurrency={concurrency}"]) == 0
    assert by_key(tmp_path / "episodes.jsonl") == episodes
    assert successes(json.loads((tmp_path / "report.json").read_text())) == successes(report)


def test_an_actor_dying_mid_eval_loses_and_duplicates_nothing(cluster, evaluated_here, tmp_path, capsys):
    marker = tmp_path / "died"
    worker = dying(EpisodeWorker, marker, "run", at_call=3)
    report = eval_from_config(eval_config(tmp_path / "out", **RAY), worker=worker)
    assert marker.read_text().isdigit()
    assert "actors lost 1, items resubmitted 1" in capsys.readouterr().err
    assert by_key(tmp_path / "out" / "episodes.jsonl") == evaluated_here[0]
    assert successes(report) == successes(evaluated_here[1])


def test_an_episode_on_a_stateful_mcp_server_is_never_run_twice(cluster, tmp_path, capsys):
    """An MCP server that keeps its state (no restart_each_task) may hold the writes of the
    episode an actor died in: the run stops instead of making them again; resuming after a
    look at the server (deleting the journal's lines) goes on. (`capsys`: the stdio client
    must start its server while sys.stderr is a stream without a file descriptor.)"""
    mcp = {"servers": [{"name": "store", "command": [sys.executable, "-m", "specagent", "env", "serve-mcp", "builtin"]}],
           "tasks_path": str(ROOT / "configs" / "tasks" / "store_mcp.jsonl")}
    overrides = [f"output_dir={tmp_path / 'out'}", f"env={json.dumps({'name': 'mcp', 'mcp': mcp})}",
                 'arms=[{"name": "strong", "mode": "strong"}]', f"executor={json.dumps(RAY)}"]
    cfg = load_config(EvalConfig, EVAL_CONFIG, overrides)
    assert "store keep their state" in cfg.env.rerun_hazard()
    with pytest.raises(SpecAgentError, match="not resubmitted: MCP server"):
        eval_from_config(cfg, worker=dying(EpisodeWorker, tmp_path / "died", "run", at_call=2))
    written = read_episodes(tmp_path / "out" / "episodes.jsonl")
    assert len(written) < 4 and len({r["task_id"] for r in written}) == len(written)
    with pytest.raises(SpecAgentError, match="started and never finished"):  # nor by a plain resume
        eval_from_config(cfg)
    restarted = {**mcp, "servers": [{**mcp["servers"][0], "restart_each_task": True}]}
    assert load_config(EvalConfig, EVAL_CONFIG, [f"env={json.dumps({'name': 'mcp', 'mcp': restarted})}"]
                       ).env.rerun_hazard() is None


def test_collect_on_ray_writes_the_same_trajectories(cluster, tmp_path):
    def collect(out: Path, executor: dict) -> Path:
        cfg = CollectConfig(env={"name": "store", "limit": 5}, strong={"backend": "scripted"}, trials=2,
                            output=str(out / "trajectories.jsonl"), executor=executor)
        return collect_from_config(cfg)

    here = collect(tmp_path / "here", {"kind": "local"})
    there = collect(tmp_path / "ray", {**RAY, "actors": 2})
    assert there.read_text() == here.read_text()  # the same runs, in the same order
    assert by_key(tmp_path / "ray" / "trajectories.episodes.jsonl") == by_key(
        tmp_path / "here" / "trajectories.episodes.jsonl")


def test_executor_keys_are_resume_neutral_and_ray_flag_sets_them(tmp_path, capsys):
    """Where the work runs does not change it: a run started locally resumes on Ray."""
    from specagent.config import config_differences

    local, remote = MineConfig(trajectories="t"), MineConfig(trajectories="t", executor=RAY)
    assert config_differences(local.model_dump(mode="json"), remote.model_dump(mode="json"), "MineConfig") == []
    assert main(["mine", "trajectories=t", "--ray", "auto", "--dump-config"]) == 0
    dumped = capsys.readouterr().out
    assert "executor:\n  kind: ray\n  address: auto\n" in dumped


def test_without_ray_installed_a_ray_run_is_a_clean_error_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    out = tmp_path / "trajectories.jsonl"
    assert main(["collect", "-c", str(ROOT / "configs" / "collect" / "store_scripted.yaml"), "--ray",
                 f"output={out}"]) == 1
    assert "pip install 'specagent[ray]'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_stages_import_ray_only_when_they_run_on_it():
    """`specagent --help` and local runs stay as fast as before: ray is imported lazily."""
    code = ("import sys, specagent.cli, specagent.data.stage, specagent.eval.matrix, specagent.runtime.ray_episodes; "
            "print('ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "False", done.stderr[-2000:]
