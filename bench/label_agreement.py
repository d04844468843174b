"""Where two labelers of the same mined drafts disagree, by tool and by step kind.

`specagent mine` with several labelers keeps each one's labels of every drafted step
(`all_labels` in its shard files). This counts, per tool (a step without calls under its
kind: `reply`, `malformed`; as `segment_stats` counts them), the drafted
steps each labeler calls valid, both, and only one of them; e.g. `rollout` against `match`:
steps S would not have written itself (match 0) that still leave the task solved (rollout 1).

    python bench/label_agreement.py runs/quickstart/mined-calibration-rollout --labelers rollout match

Writes `--out` (JSON with the command and the git SHA); prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable

from specagent.runtime.drafting import step_tools
from specagent.runtime.provenance import versions


def segments_of(mined: Path) -> Iterable[dict[str, Any]]:
    """Every drafted segment in a mine output dir's shard files (reference segments left out)."""
    shards = sorted((mined / "shards").glob("shard-*.jsonl"))
    if not shards:
        raise SystemExit(f"{mined}: no shards/shard-*.jsonl (a `specagent mine` output dir?)")
    for shard in shards:
        for line in shard.read_text().splitlines():
            for segment in json.loads(line)["segments"]:
                if segment.get("label_source") != "reference":
                    yield segment


def agreement(segments: Iterable[dict[str, Any]], a: str, b: str) -> dict[str, dict[str, int]]:
    """tool -> {drafted, a, b, both, only_a, only_b}, with an `all` row."""
    table: dict[str, Counter] = defaultdict(Counter)
    for segment in segments:
        labels = segment.get("all_labels") or {}
        if a not in labels or b not in labels:
            raise SystemExit(f"segment {segment.get('id')}: labels {sorted(labels)}, not both {a} and {b}")
        for step, x, y in zip(segment["steps"], labels[a], labels[b]):
            for key in (*step_tools(step), "all"):  # grouped as the mining stats group steps
                row = table[key]
                row["drafted"] += 1
                row[a] += x
                row[b] += y
                row["both"] += x and y
                row[f"only_{a}"] += x and not y
                row[f"only_{b}"] += y and not x
    return {tool: dict(row) for tool, row in sorted(table.items(), key=lambda kv: (kv[0] == "all", kv[0]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mined", nargs="+", type=Path, help="`specagent mine` output dirs")
    parser.add_argument("--labelers", nargs=2, default=["rollout", "match"], metavar=("A", "B"))
    parser.add_argument("--out", type=Path, default=Path("runs/bench/label_agreement.json"))
    args = parser.parse_args()
    a, b = args.labelers
    tables = {str(m): agreement(segments_of(m), a, b) for m in args.mined}
    for mined, table in tables.items():
        print(f"\n{mined}")
        print(f"{'tool':32} {'drafted':>7} {a:>8} {b:>8} {'both':>6} {'only ' + a:>13} {'only ' + b:>13}")
        for tool, row in table.items():
            print(f"{tool:32} {row['drafted']:7d} {row[a]:8d} {row[b]:8d} {row['both']:6d} "
                  f"{row['only_' + a]:13d} {row['only_' + b]:13d}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "git_sha": versions().get("git_sha"),
                                    "labelers": [a, b], "tables": tables}, indent=2))
    print(f"\n-> {args.out}")


if __name__ == "__main__":
    main()
