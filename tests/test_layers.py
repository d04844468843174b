"""The layering is a contract, checked by import-linter (pyproject.toml): the stages sit side
by side on the runtime, which sits on engines, environments, config and records, which sit
on the core. The contract holds today, and it fails when a stage imports another."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT), "--config", str(tree / "pyproject.toml"), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout


def test_a_stage_importing_another_stage_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "specagent", tmp_path / "specagent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    drafter = tmp_path / "specagent" / "train" / "drafter.py"
    drafter.write_text(drafter.read_text() + "\nfrom specagent.data import mine  # noqa: E402,F401\n")
    done = lint(tmp_path)
    assert done.returncode != 0
    assert "specagent.train is not allowed to import specagent.data" in done.stdout
    assert "specagent.train.drafter -> specagent.data.mine" in done.stdout
