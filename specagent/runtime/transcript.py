"""Human-readable output: an episode's transcript and a run's summary table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specagent.core.protocol import Episode

# Wide enough for the summary table when stdout is a file or a CI log.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

STATUS_STYLE = {
    "accepted": ("✓ accepted", "green"),
    "held_approved": ("✓ held→run", "green"),
    "rejected": ("✗ rejected", "red"),
    "malformed": ("✗ malformed", "red"),
    "repaired": ("⟲ repaired", "yellow"),
    "authored": ("• authored", "cyan"),
}


def print_transcript(ep: Episode, record: dict[str, Any] | None = None) -> None:
    console.rule(f"task {ep.task_id} · {ep.mode} · reward {ep.reward:g} · stop {ep.stop_reason}")
    shown_round = -1
    for step in ep.steps:
        if step.round != shown_round and step.round < len(ep.verdicts) and ep.mode == "specagent":
            shown_round = step.round
            verdict = ep.verdicts[step.round].replace("\n", " ")[:60]
            console.print(f" r{step.round:<2} [dim]verdict {verdict!r} → accept {ep.accepted_prefixes[step.round]}[/dim]")
        label, style = STATUS_STYLE[step.status.value]
        held = " (held)" if step.kind.value in ("write", "reply") and step.source == "weak" else ""
        text = step.text.replace("\n", " ")
        if step.malformed:
            text = f"[{step.malformed}] {text}"
        console.print(f" r{step.round:<2} {step.source:<6} [{style}]{label:<12}[/{style}] "
                      f"{step.kind.value:<9}{held} {text[:140]}", markup=True, soft_wrap=True)


def _fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "–"
    return format(value, spec)


def print_summary(summary: dict[str, Any], out_dir: Path) -> None:
    table = Table(title=f"summary ({out_dir})")
    for col in ("mode", "episodes", "success", "acceptance", "mean prefix", "repairs",
                "strong decode", "strong decode ratio", "mem traffic GB", "mem ratio", "wall s", "wall ratio"):
        table.add_column(col, justify="right")
    for mode, s in summary.items():
        table.add_row(
            mode, str(s["episodes"]), _fmt(s["success"]["mean"]), _fmt(s["acceptance_rate"]),
            _fmt(s["mean_accepted_prefix"]), str(s["repairs"]), str(s["strong_decode_tokens"]),
            _fmt(s.get("strong_decode_ratio")), _fmt(s["memory_traffic_bytes"] / 1e9, ".3f"),
            _fmt(s.get("memory_traffic_ratio")), _fmt(s["wall_seconds"], ".1f"), _fmt(s.get("wall_time_ratio")),
        )
    console.print(table)
    console.print(f"episodes: {out_dir / 'episodes.jsonl'}   summary: {out_dir / 'summary.json'}")
