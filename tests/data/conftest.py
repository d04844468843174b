"""Shared inputs for the data-stage tests: the real tau-bench airline runs and the airline tools file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
AIRLINE_YAML = ROOT / "configs" / "import" / "tau_airline_tools.yaml"
# shared/ lies beside the checkout (as in CI: a clean clone with a copy of shared/ next to it)
AIRLINE_RUNS = Path(
    os.environ.get(
        "SPECAGENT_AIRLINE_RUNS",
        ROOT.parent / "shared" / "data" / "tau-bench-airline" / "gpt-4o-trajectories-tasks-00-24.json",
    )
)


@pytest.fixture(scope="session")
def airline_path() -> Path:
    if not AIRLINE_RUNS.exists():
        pytest.skip(f"real airline runs not found at {AIRLINE_RUNS} (set SPECAGENT_AIRLINE_RUNS)")
    return AIRLINE_RUNS


@pytest.fixture(scope="session")
def airline_raw(airline_path) -> list[dict]:
    return json.loads(airline_path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def airline_import(airline_path):
    """(trajectories, report) of the airline runs with the shipped tools file."""
    from specagent.data.importers import convert_files

    return convert_files([airline_path], tools_yaml=AIRLINE_YAML, model="gpt-4o")
