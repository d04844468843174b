"""Keep a measured result: a small JSON under `bench/results/`, with its command and git SHA.

Generated runs live in ignored folders (`runs/`); what the README and `docs/results.md` quote
is kept here, small enough to commit, so the tables can be regenerated from it.

    python bench/record.py runs/eval-store-expert/report.json --name store_expert_eval \\
        --command "specagent eval -c configs/eval/store_expert_vllm.yaml"
    python bench/record.py runs/bench/store_pair.json --name store_pair --command "python bench/store_pair.py ..."

An eval report (`specagent.report/v1`) is cut down to each arm's headline figures (acceptance
per tool among them) plus its success per task category (the task id without its split and
number, e.g. `cancel`); any other JSON is kept whole.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

HEADLINE = ("mode", "threshold", "roles", "episodes", "tasks", "success", "max_steps_episodes", "drafted_steps",
            "accepted_steps", "acceptance_rate", "mean_accepted_prefix", "repairs", "continued_repairs",
            "malformed_drafts", "strong_decode_tokens", "strong_prefill_tokens", "strong_cached_tokens",
            "weak_decode_tokens", "memory_traffic_bytes", "wall_seconds", "model_seconds",
            "strong_decode_ratio", "memory_traffic_ratio", "wall_time_ratio", "gap_recovered", "per_tool")
RESULTS = Path(__file__).parent / "results"


def category(task_id: str) -> str:
    """`eval-cancel-0002` -> `cancel`; the 42 hand-checked tasks (`lookup_12`) -> `lookup`."""
    name = re.sub(r"^(train|calibration|eval)-", "", task_id)
    return re.sub(r"[-_]\d+$", "", name)


def per_category(episodes: Path) -> dict[str, dict[str, dict[str, float]]]:
    """arm -> category -> {solved, tasks}, from an eval's episodes.jsonl."""
    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in episodes.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            table[row["arm"]][category(row["task_id"])].append(float(row["reward"] or 0.0))
    return {arm: {c: {"solved": sum(r >= 1.0 for r in rs), "tasks": len(rs)} for c, rs in sorted(cats.items())}
            for arm, cats in table.items()}


def by_role(ledger: dict) -> dict[str, dict[str, float]]:
    """model/role -> calls, tokens and engine seconds: where an arm's time went."""
    keep = ("calls", "prompt_tokens", "cached_tokens", "decode_tokens", "seconds")
    return {f"{model}/{role}": {k: stats[k] for k in keep} for model, roles in ledger.items()
            for role, stats in roles.items()}


def summarize(source: Path) -> dict:
    data = json.loads(source.read_text())
    if data.get("format") != "specagent.report/v1":
        return data
    arms = {name: {**{k: arm.get(k) for k in HEADLINE}, "by_role": by_role(arm.get("ledger") or {})}
            for name, arm in data["arms"].items()}
    episodes = source.parent / "episodes.jsonl"
    return {"format": data["format"], "arms": arms, "notes": data.get("notes", []),
            "per_category": per_category(episodes) if episodes.is_file() else None,
            "config": data.get("config"), "versions": data.get("versions")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a report.json or a bench script's JSON")
    parser.add_argument("--name", required=True, help="bench/results/<name>.json")
    parser.add_argument("--command", required=True, help="the command that produced the source")
    parser.add_argument("--note", default="", help="what the reader should know about this run")
    args = parser.parse_args()
    result = summarize(args.source)
    beside = args.source.parent / "versions.json"  # a training output keeps its versions there
    versions = result.get("versions") or (json.loads(beside.read_text()) if beside.is_file() else {})
    record = {"name": args.name, "command": args.command, "note": args.note,
              "git_sha": versions.get("git_sha") or result.get("git_sha"),
              "recorded": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "source": str(args.source),
              "result": result}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{args.name}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{out}  ({out.stat().st_size / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
