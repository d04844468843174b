"""`specagent quickstart`: collect -> mine -> train -> export -> eval, as one command.

The pipeline is a list of stages in `configs/quickstart/pipeline.yaml`; each stage is a
`specagent` command with its own config, run as a separate process exactly as a user
would type it (the command is printed), so any stage can be rerun alone. A stage whose
output is already on disk is skipped: rerunning resumes, `--fresh` starts over.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import Field

from specagent.config import (
    CollectConfig,
    DrafterTrainConfig,
    EvalConfig,
    MineConfig,
    Strict,
    VerdictTrainConfig,
    load_config,
)
from specagent.core.errors import ConfigError, SpecAgentError
from specagent.core.types import Quantization

SCHEMAS = {"collect": CollectConfig, "mine": MineConfig, "train drafter": DrafterTrainConfig,
           "train verdict": VerdictTrainConfig, "eval": EvalConfig}


class StageConfig(Strict):
    command: Literal["import", "collect", "mine", "train drafter", "train verdict", "export", "eval"]
    config: Optional[str] = None  # relative to the pipeline file
    # export: `from` a training output `to` an export dir; import: `inputs` (agent logs) `to` a trajectories.jsonl
    from_: Optional[str] = Field(None, alias="from")
    to: Optional[str] = None
    # import only
    inputs: Optional[list[str]] = None
    tools: Optional[str] = None  # the tool schemas / read_only-write lists (configs/import/)
    model: Optional[str] = None  # the model name stored in each trajectory
    # export only
    merge: bool = False
    backend: Literal["vllm", "transformers"] = "vllm"
    quantize: Optional[Quantization] = None
    prune_vocab: bool = False


class PipelineConfig(Strict):
    stages: list[StageConfig] = Field(min_length=1)
    output_dir: str = "runs/quickstart"  # where timings.json is written


def stage_plan(stage: StageConfig, base: Path) -> tuple[list[str], Path, str]:
    """(the specagent argv, the output that marks it done, a label)."""
    if stage.command == "import":
        if not stage.inputs or not stage.to:
            raise ConfigError("an import stage needs `inputs` and `to`")
        argv = ["import", *stage.inputs, "--out", stage.to]
        argv += (["--tools", stage.tools] if stage.tools else []) + (["--model", stage.model] if stage.model else [])
        return argv, Path(stage.to), f"import {stage.to}"
    if stage.command == "export":
        if not stage.from_ or not stage.to:
            raise ConfigError("an export stage needs `from` and `to`")
        argv = ["export", stage.from_, "-o", stage.to, "--backend", stage.backend] + (["--merge"] if stage.merge else [])
        argv += ["--quantize", stage.quantize] if stage.quantize else []
        argv += ["--prune-vocab"] if stage.prune_vocab else []
        return argv, Path(stage.to) / "export.json", f"export {stage.to}"
    if not stage.config:
        raise ConfigError(f"stage {stage.command!r} needs a `config`")
    path = base / stage.config
    cfg = load_config(SCHEMAS[stage.command], path, [])
    done = {
        "collect": lambda: Path(cfg.output),
        "mine": lambda: Path(cfg.output_dir) / "stats.json",
        "train drafter": lambda: Path(cfg.output_dir) / "metrics.json",  # written last, LoRA or full model
        "train verdict": lambda: Path(cfg.output_dir) / ("head/likelihood_head.json" if cfg.kind == "likelihood"
                                                        else "adapter/adapter_config.json"),
        "eval": lambda: Path(cfg.output_dir) / "report.md",
    }[stage.command]()
    return [*stage.command.split(), "-c", str(path)], done, f"{stage.command} ({path.name})"


def outputs_of(stage: StageConfig, base: Path) -> list[Path]:
    """What `--fresh` removes for a stage."""
    if stage.command in ("export", "import"):
        return [Path(stage.to)] if stage.to else []
    cfg = load_config(SCHEMAS[stage.command], base / stage.config, [])
    if stage.command == "collect":
        from specagent.data.stage import collect_files

        return [Path(cfg.output), *collect_files(Path(cfg.output))]  # and the episodes it resumes from
    return [Path(cfg.output_dir)]


def run_pipeline(pipeline: str | Path, fresh: bool = False, out: str | Path | None = None) -> dict:
    """Run every stage not yet done, in order; print timings and the eval report at the end.
    timings.json goes to ``out`` (default: the pipeline's `output_dir`)."""
    pipeline = Path(pipeline)
    if not pipeline.is_file():
        raise ConfigError(f"{pipeline}: no such pipeline file")
    cfg = load_config(PipelineConfig, pipeline, [])
    base = pipeline.parent
    plans = [stage_plan(stage, base) for stage in cfg.stages]  # every config validated before any work
    if fresh:
        for stage in cfg.stages:
            for path in outputs_of(stage, base):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    out = Path(out or cfg.output_dir)
    earlier = {} if fresh else earlier_timings(out / "timings.json")
    timings: list[dict] = []
    began = time.perf_counter()

    def record(failed: str | None = None) -> dict:
        """timings.json after every stage, so an interrupted run keeps what its stages took."""
        summary = {"stages": timings, "seconds": round(time.perf_counter() - began, 1), "failed": failed}
        out.mkdir(parents=True, exist_ok=True)
        (out / "timings.json").write_text(json.dumps(summary, indent=2))
        return summary

    for n, (argv, done, label) in enumerate(plans, 1):
        if done.exists():
            print(f"\n[{n}/{len(plans)}] {label}: done ({done} exists), skipped", flush=True)
            timings.append({"stage": label, "seconds": 0.0, "skipped": True, "earlier_seconds": earlier.get(label)})
            continue
        command = [sys.executable, "-m", "specagent", *argv]
        print(f"\n[{n}/{len(plans)}] {label}\n$ specagent {shlex.join(argv)}", flush=True)
        start = time.perf_counter()
        code = subprocess.run(command).returncode
        timings.append({"stage": label, "seconds": round(time.perf_counter() - start, 1), "skipped": False})
        if code != 0:
            record(failed=label)
            raise SpecAgentError(f"stage {n} ({label}) failed with exit code {code}; fix it and rerun "
                                 "`specagent quickstart` to resume from this stage")
        record()
    summary = record()
    total = summary["seconds"]
    print("\nquickstart stages:")
    for t in timings:
        shown = f"{t['seconds']:.0f} s" if not t["skipped"] else (
            "skipped" if t["earlier_seconds"] is None else f"skipped (took {t['earlier_seconds']:.0f} s before)")
        print(f"  {t['stage']:<56} {shown}")
    print(f"  {'total':<56} {total:.0f} s")
    for report in report_paths(pipeline):
        if report.exists():
            print(f"\nreport: {report} (+ report.json and plots beside it)")
    return summary


def earlier_timings(path: Path) -> dict[str, float]:
    """Each stage's seconds from an earlier run's timings.json (a skipped stage keeps its time)."""
    try:
        stages = json.loads(path.read_text())["stages"]
        return {t["stage"]: t["seconds"] if not t["skipped"] else t.get("earlier_seconds") for t in stages}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def report_paths(pipeline: str | Path) -> list[Path]:
    """The report.md of each eval stage of the pipeline, in order."""
    pipeline = Path(pipeline)
    return [Path(yaml.safe_load((pipeline.parent / stage.config).read_text()).get("output_dir", "runs/eval"))
            / "report.md" for stage in load_config(PipelineConfig, pipeline, []).stages if stage.command == "eval"]
