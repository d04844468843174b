"""The eval report, from an eval dir's `episodes.jsonl` and `config.yaml` alone:
report.json (every metric of DESIGN §3 per arm, 95% intervals over tasks), report.md
(the paper's table), the plots, and the same table on the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from rich.table import Table

from specagent.config import EvalConfig, load_config
from specagent.core.errors import ConfigError
from specagent.core.metrics import summarize
from specagent.eval.arms import ArmRun, expand_arms
from specagent.eval.plots import PLOTS, write_plots
from specagent.records.reports import Report
from specagent.runtime.episodes import read_episodes
from specagent.runtime.transcript import console

COLUMNS = ("arm", "success", "gap recovered", "acceptance", "mean accepted prefix", "strong decode tokens / episode",
           "strong decode ratio", "memory-traffic ratio", "wall-time ratio", "ended by max_steps")


def _first_of_mode(runs: list[ArmRun], mode: str) -> str | None:
    return next((run.label for run in runs if run.arm.mode == mode), None)


def _roles(run: ArmRun, models: dict[str, str]) -> dict[str, Any]:
    """Which model played which role in one arm, and what it carried."""
    verifier = None
    if run.arm.mode == "specagent":
        verifier = run.arm.verifier.model_dump() if run.arm.verifier else {"kind": "generative"}
        if run.threshold is not None:
            verifier["threshold"] = run.threshold
    return {"strong": models.get("strong"), "weak": models.get("weak"), "own_weak": run.arm.weak is not None,
            "drafter_adapter": run.arm.drafter_adapter, "verifier": verifier,
            "drafting": run.arm.drafting.model_dump(exclude_none=True) if run.arm.drafting else None}


def _notes(runs: list[ArmRun], arms: dict[str, Any], strong: str | None, weak: str | None) -> list[str]:
    notes = [f"arm {run.label!r} has no episodes yet" for run in runs if run.label not in arms]
    if strong is None:
        notes.append("no arm of mode 'strong': strong_decode_ratio, memory_traffic_ratio and wall_time_ratio are null")
    if strong is None or weak is None:
        notes.append("gap_recovered needs an arm of mode 'strong' and one of mode 'weak': it is null")
    elif strong in arms and arms[strong]["gap_recovered"] is None:
        notes.append("strong and weak succeed equally often on the tasks they share: gap_recovered is null (0/0)")
    return notes


def build_report(records: Iterable[dict[str, Any]], cfg: EvalConfig, versions: dict[str, Any]) -> dict[str, Any]:
    """Every metric per arm (`core.metrics.summarize` grouped by arm), ratios against the first
    arm of mode strong, gap recovered against the first of mode weak, the roles and the config."""
    runs = expand_arms(cfg.arms)
    labels = {run.label for run in runs}
    mine = [r for r in records if r.get("arm") in labels]
    strong, weak = _first_of_mode(runs, "strong"), _first_of_mode(runs, "weak")
    summary = summarize(mine, by="arm", strong=strong, weak=weak)
    models = {r["arm"]: r["models"] for r in mine}
    arms = {run.label: {"arm": run.arm.name, "mode": run.arm.mode, "threshold": run.threshold,
                        "roles": _roles(run, models[run.label]), **summary[run.label]}
            for run in runs if run.label in summary}
    return Report(
        reference={"strong": strong, "weak": weak}, arms=arms, notes=_notes(runs, arms, strong, weak),
        plots=list(PLOTS), config=cfg.model_dump(mode="json"), versions=versions,
    ).dump()


def _cell(ci: dict[str, Any] | None, spec: str = ".2f") -> str:
    """mean [lo, hi]; the mean alone where the interval is a point."""
    if not ci or ci["mean"] is None:
        return "–"
    if ci["lo"] == ci["hi"]:
        return format(ci["mean"], spec)
    return f"{ci['mean']:{spec}} [{ci['lo']:{spec}}, {ci['hi']:{spec}}]"


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for label, arm in report["arms"].items():
        ci = arm["ci"]
        rows.append([label, _cell(arm["success"]), _cell(ci["gap_recovered"]), _cell(ci["acceptance_rate"]),
                     _cell(ci["mean_accepted_prefix"]), _cell(ci["strong_decode_tokens"], ".0f"),
                     _cell(ci["strong_decode_ratio"]), _cell(ci["memory_traffic_ratio"]), _cell(ci["wall_time_ratio"]),
                     f"{arm.get('max_steps_episodes', 0)}/{arm['episodes']}"])
    return rows


def _verifier_text(verifier: dict[str, Any]) -> str:
    if verifier["kind"] == "likelihood" and verifier.get("head"):
        threshold = verifier.get("threshold")
        return (f"likelihood head `{verifier['head']}` over the strong model's own token probabilities, "
                f"at threshold {'calibrated' if threshold is None else threshold}")
    if verifier["kind"] == "likelihood":
        threshold = verifier.get("threshold")
        return ("likelihood verdict (the strong model's own token probabilities): "
                + ("greedy steps only" if threshold in (None, 1.0) else f"non-greedy tokens need p >= {threshold}"))
    if verifier["kind"] == "head":
        threshold = verifier.get("threshold")
        return f"verdict head `{verifier['head']}` at threshold {'calibrated' if threshold is None else threshold}"
    adapter = verifier.get("adapter")
    return "generative verdict" + (f" with adapter `{adapter}`" if adapter else " (base weights)")


def role_lines(report: dict[str, Any]) -> list[str]:
    """Which model played which role, then what each arm added to it."""
    models: dict[str, str] = {}
    for arm in report["arms"].values():  # the eval's models; an arm's own weak model is named with the arm
        models.update({role: arm["roles"][role] for role in ("strong", "weak")
                       if arm["roles"][role] and not (role == "weak" and arm["roles"]["own_weak"])})
    what = {"strong": "strong model (verifies, repairs; acts in `strong`)",
            "weak": "weak model (drafts; acts in `weak`)"}
    lines = ["Roles: " + "; ".join(f"{what[role]} = `{name}`" for role, name in sorted(models.items()))]
    for label, arm in report["arms"].items():
        roles, parts = arm["roles"], []
        if roles["own_weak"]:
            parts.append(f"its own weak model `{roles['weak']}`")
        if roles["drafter_adapter"]:
            parts.append(f"drafter adapter `{roles['drafter_adapter']}`")
        if roles["verifier"]:
            parts.append(_verifier_text(roles["verifier"]))
        drafting = roles.get("drafting") or {}  # reports written before `drafting` have none
        if "max_draft_steps" in drafting:
            parts.append(f"at most {drafting['max_draft_steps']} drafted steps a round")
        if drafting.get("draft_stop_below"):
            parts.append(f"the drafter stops a step at a token below p = {drafting['draft_stop_below']}")
        if parts:
            lines.append(f"- `{label}`: " + ", ".join(parts))
    return lines


def markdown(report: dict[str, Any], plots: list[str]) -> str:
    cfg, ref = report["config"], report["reference"]
    tasks = max((arm["tasks"] for arm in report["arms"].values()), default=0)
    lines = [
        f"# Eval report: `{cfg['output_dir']}`", "",
        (f"{tasks} task(s) of `{cfg['env']['name']}`, {cfg['trials']} trial(s) per arm. Ratios are against arm "
         f"`{ref['strong']}` on the tasks both ran"
         + (f"; gap recovered = (success − `{ref['weak']}`) / (`{ref['strong']}` − `{ref['weak']}`)"
            if ref['weak'] is not None else "")
         + ". Brackets: 95% intervals over tasks."), "",
        *role_lines(report), "",
        "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(row) + " |" for row in table_rows(report)), "",
    ]
    if report["notes"]:
        lines += [*(f"- note: {note}" for note in report["notes"]), ""]
    lines += ["Plots: " + " · ".join(f"[{p.removesuffix('.png')}]({p})" for p in plots), ""]
    lines += [f"![{p.removesuffix('.png')}]({p})" for p in plots]
    lines += ["", ("Every metric per arm (tokens per model and role, per tool, by position): "
                   "[report.json](report.json)"), ""]
    return "\n".join(lines)


def print_report(report: dict[str, Any], out_dir: Path) -> None:
    table = Table(title=f"eval ({out_dir})")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "arm" else "right")
    for row in table_rows(report):
        table.add_row(*row)
    console.print(table)
    for line in role_lines(report) + [f"note: {n}" for n in report["notes"]]:
        console.print(line, markup=False)
    console.print(f"report: {out_dir / 'report.md'}   metrics: {out_dir / 'report.json'}", markup=False)


def write_report(out_dir: str | Path) -> dict[str, Any]:
    """Write report.json, the plots and report.md of an eval dir, print the table; returns the report.
    `specagent eval` ends with this; `specagent report` reruns it on the episodes so far."""
    out_dir = Path(out_dir)
    if not (out_dir / "config.yaml").exists():
        raise ConfigError(f"{out_dir}: no config.yaml here; pass the output_dir of a `specagent eval`")
    cfg = load_config(EvalConfig, out_dir / "config.yaml")
    versions_path = out_dir / "versions.json"
    versions = json.loads(versions_path.read_text()) if versions_path.exists() else {}
    report = build_report(read_episodes(out_dir / "episodes.jsonl"), cfg, versions)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    plots = write_plots(report, out_dir)
    (out_dir / "report.md").write_text(markdown(report, plots))
    print_report(report, out_dir)
    return report
