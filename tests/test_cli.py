"""The `specagent` command as a user runs it: exit codes, messages, files written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def specagent(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "specagent", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_help_is_instant_and_lists_run():
    out = specagent("--help")
    assert out.returncode == 0 and "run" in out.stdout


def test_config_typo_exits_2_with_every_problem_and_no_traceback():
    out = specagent("run", "-c", "configs/run/store_smollm2_transformers.yaml", "mdoe=strong", "protocol.max_steps=-3")
    assert out.returncode == 2
    assert "mdoe: unknown key" in out.stderr and "protocol.max_steps" in out.stderr
    assert "Traceback" not in out.stderr


def test_dump_config_prints_resolved_values():
    out = specagent("run", "-c", "configs/run/store_smollm2_transformers.yaml", "--dump-config", "env.limit=7")
    assert out.returncode == 0 and "limit: 7" in out.stdout


def test_scripted_run_writes_episodes_summary_and_resumes(tmp_path):
    args = ("run", "-c", "configs/run/store_scripted.yaml", f"output_dir={tmp_path}", "env.limit=4")
    first = specagent(*args)
    assert first.returncode == 0, first.stderr
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert all(json.loads(line)["reward"] == 1.0 for line in lines)  # the scripted expert solves them
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["specagent"]["episodes"] == 4
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "versions.json").exists()
    again = specagent(*args[:-1], "env.limit=6")
    assert again.returncode == 0
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 6  # 2 new, none repeated


def test_broken_task_file_names_file_and_line(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    good = (ROOT / "specagent/envs/store/tasks.jsonl").read_text().splitlines()[0]
    tasks.write_text(good + "\n{not json\n")
    out = specagent("run", "-c", "configs/run/store_scripted.yaml", f"env.tasks_path={tasks}", f"output_dir={tmp_path}/o")
    assert out.returncode == 2
    assert f"{tasks}:2:" in out.stderr and "Traceback" not in out.stderr


def test_unreachable_openai_server_is_a_clear_error(tmp_path):
    config = tmp_path / "openai.yaml"
    config.write_text("mode: strong\nenv: {name: store}\n"
                      "strong: {backend: openai, base_url: 'http://127.0.0.1:9/v1', max_retries: 0, timeout_s: 2}\n")
    out = specagent("run", "-c", str(config), f"output_dir={tmp_path / 'out'}")
    assert out.returncode == 1
    assert "127.0.0.1:9" in out.stderr and "Traceback" not in out.stderr


def test_engine_logs_print_errors_only_unless_verbose(monkeypatch):
    from specagent.cli import quiet_engines

    for name in ("VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY"):
        monkeypatch.delenv(name, raising=False)
    quiet_engines(verbose=True)
    assert "VLLM_LOGGING_LEVEL" not in os.environ
    quiet_engines(verbose=False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # the user's own choice wins
    quiet_engines(verbose=False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"
