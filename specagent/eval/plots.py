"""The eval plots (PNG), drawn from report.json alone: acceptance by drafted-step position,
acceptance by tool, and cost against quality with the threshold-sweep curves."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DRAFTING_MODES = ("stepwise", "specagent")


def _colors(report: dict[str, Any]) -> dict[str, str]:
    """One colour per arm in every plot: black for the first strong arm, grey for the first weak
    one, a cycle for the rest (a second weak-mode arm, e.g. one with its own weak model, too)."""
    colors, others = {}, 0
    for label, arm in report["arms"].items():
        fixed = {"strong": "black", "weak": "0.5"}.get(arm["mode"])
        if fixed is not None and fixed not in colors.values():
            colors[label] = fixed
        else:
            colors[label], others = f"C{others % 10}", others + 1
    return colors


def _drafting(report: dict[str, Any]) -> list[str]:
    return [label for label, arm in report["arms"].items() if arm["mode"] in DRAFTING_MODES and arm["drafted_steps"]]


def _finish(ax: Axes, empty_text: str) -> None:
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, empty_text, ha="center", va="center", transform=ax.transAxes)


def plot_acceptance_by_position(report: dict[str, Any], fig: Figure) -> None:
    ax = fig.subplots()
    colors = _colors(report)
    for i, label in enumerate(_drafting(report)):
        by_position = report["arms"][label]["by_position"]
        xs = sorted(int(p) for p in by_position)
        ys = [by_position[str(x)]["rate"] for x in xs]
        ax.plot(xs, ys, marker="os^vD<>"[i % 7], color=colors[label], label=label, alpha=0.85)
    ax.set_title("Acceptance by position of the drafted step in its segment")
    ax.set_xlabel("drafted step position (1 = first step after the committed context)")
    ax.set_ylabel("acceptance rate (accepted / drafted)")
    ax.set_ylim(-0.03, 1.03)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _finish(ax, "no drafted steps (no stepwise or specagent arm)")


def plot_acceptance_by_tool(report: dict[str, Any], fig: Figure) -> None:
    drafting = _drafting(report)
    tools = sorted({tool for label in drafting for tool in report["arms"][label]["per_tool"]})
    fig.set_size_inches(max(7.0, 1.1 * len(tools) * max(len(drafting), 1) ** 0.5), 5.0)
    ax = fig.subplots()
    colors = _colors(report)
    width = 0.8 / max(len(drafting), 1)
    for i, label in enumerate(drafting):
        per_tool = report["arms"][label]["per_tool"]
        xs = [j + (i - (len(drafting) - 1) / 2) * width for j in range(len(tools))]
        rates = [(per_tool.get(t) or {}).get("rate") or 0.0 for t in tools]
        ax.bar(xs, rates, width, color=colors[label], label=label, alpha=0.85)
        for x, tool, rate in zip(xs, tools, rates, strict=True):
            drafted = (per_tool.get(tool) or {}).get("drafted", 0)
            ax.annotate(str(drafted), (x, rate), ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                        textcoords="offset points")
    ax.set_xticks(range(len(tools)), tools, rotation=30, ha="right")
    ax.set_title("Acceptance by tool of the drafted step (numbers: drafted steps)")
    ax.set_xlabel("tool called by the drafted step (reply: a message to the user)")
    ax.set_ylabel("acceptance rate (accepted / drafted)")
    ax.set_ylim(0, 1.1)
    _finish(ax, "no drafted steps (no stepwise or specagent arm)")


def _yerr(success: dict[str, Any]) -> list[list[float]]:
    return [[success["mean"] - success["lo"]], [success["hi"] - success["mean"]]]


def plot_cost_quality(report: dict[str, Any], fig: Figure) -> None:
    fig.set_size_inches(12.0, 5.0)
    axes = fig.subplots(1, 2, sharey=True)
    colors = _colors(report)
    sweeps: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for label, arm in report["arms"].items():
        if arm["threshold"] is not None:
            sweeps[arm["arm"]].append((arm["threshold"], label))
    for ax, key, what in ((axes[0], "strong_decode_ratio", "strong-model decode tokens"),
                          (axes[1], "memory_traffic_ratio", "memory traffic (both models)")):
        for label, arm in report["arms"].items():
            if arm[key] is None or arm["threshold"] is not None:
                continue
            reference = arm["mode"] in ("strong", "weak")  # drawn on top: other arms may sit on them
            ax.errorbar(arm[key], arm["success"]["mean"], yerr=_yerr(arm["success"]), capsize=3, label=label,
                        fmt={"strong": "*", "weak": "s"}.get(arm["mode"], "o"), ms=11 if reference else 7,
                        color=colors[label], zorder=3 if reference else 2, alpha=1.0 if reference else 0.8)
        for name, points in sweeps.items():
            points = [(t, lab) for t, lab in sorted(points) if report["arms"][lab][key] is not None]
            if not points:
                continue
            xs = [report["arms"][lab][key] for _, lab in points]
            ys = [report["arms"][lab]["success"]["mean"] for _, lab in points]
            ax.plot(xs, ys, "--D", color=colors[points[0][1]], label=f"{name} (threshold sweep)")
            for (t, _), x, y in zip(points, xs, ys, strict=True):
                ax.annotate(f"t={t:g}", (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_title(f"success vs {what}")
        ax.set_xlabel(f"{what}, relative to the strong-only arm (= 1)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("task success rate (95% CI over tasks)")
    fig.suptitle("Cost and quality of each arm (lower-left is cheap, top is good)")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 5), fontsize=8)
    else:
        for ax in axes:
            ax.text(0.5, 0.5, "no ratios: the eval has no strong arm", ha="center", va="center", transform=ax.transAxes)


PLOTS: dict[str, Callable[[dict[str, Any], Figure], None]] = {
    "acceptance_by_position.png": plot_acceptance_by_position,
    "acceptance_by_tool.png": plot_acceptance_by_tool,
    "cost_quality.png": plot_cost_quality,
}


def write_plots(report: dict[str, Any], out_dir: Path) -> list[str]:
    """Draw every plot into ``out_dir``; returns the file names written (none without matplotlib)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return []
    for name, draw in PLOTS.items():
        fig = Figure(figsize=(8.0, 5.0), layout="constrained")  # no pyplot: no global backend state
        draw(report, fig)
        fig.savefig(out_dir / name, dpi=120)
    return list(PLOTS)
