"""The cheap reply judges of the `match` labeler on the hand-labelled airline reply pairs
(tests/data/fixtures/reply_pairs.jsonl): agreement with the labels, false-accept rate on
contradicting pairs, false-accept overall, false-reject on paraphrases; with --errors, the
pairs each judge gets wrong; with --runs, a check that every text is verbatim from the runs
named in its `source` (whole sentences may be cut where the note says so).

    python bench/reply_judge.py [--errors] [--runs /work/shared/data/tau-bench-airline/gpt-4o-trajectories-tasks-00-24.json]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from specagent.runtime.labelers import claim_judge, overlap_judge, reply_claim

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixtures" / "reply_pairs.jsonl"
JUDGES = {"overlap_judge": overlap_judge, "claim_judge": claim_judge}


def load(path: Path = FIXTURE) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures(pairs: list[dict], judge) -> dict:
    said = [bool(judge(p["draft"], p["reference"])) for p in pairs]

    def rate(keep):
        picked = [s for p, s in zip(pairs, said) if keep(p)]
        return {"n": len(picked), "accepted": sum(picked)}

    contradictions = rate(lambda p: p["kind"] == "contradiction")
    invalid = rate(lambda p: p["label"] == 0)
    paraphrases = rate(lambda p: p["kind"] == "paraphrase" and p["label"] == 1)
    agree = sum(s == bool(p["label"]) for p, s in zip(pairs, said))
    return {
        "agreement": agree / len(pairs),
        "false_accept_contradictions": contradictions["accepted"] / contradictions["n"],
        "false_accept_all": invalid["accepted"] / invalid["n"],
        "false_reject_paraphrases": 1 - paraphrases["accepted"] / paraphrases["n"],
        "counts": {"pairs": len(pairs), "contradictions": contradictions, "label_0": invalid,
                   "paraphrases_label_1": paraphrases},
    }


def check_verbatim(pairs: list[dict], runs_path: Path) -> list[str]:
    runs = json.loads(runs_path.read_text())
    problems = []
    for n, p in enumerate(pairs):
        for side in ("draft", "reference"):
            m = re.search(rf"{side} run (\d+) msg (\d+)", p["source"])
            original = runs[int(m[1])]["traj"][int(m[2])]["content"]
            if p[side] != original and not all(s in original for s in re.split(r"(?<=[.!?])\s+", p[side])):
                problems.append(f"pair {n} {side}: not verbatim from run {m[1]} msg {m[2]}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--runs", type=Path)
    parser.add_argument("--errors", action="store_true")
    args = parser.parse_args()
    pairs = load(args.fixture)
    out = {name: figures(pairs, judge) for name, judge in JUDGES.items()}
    print(json.dumps(out, indent=1))
    if args.errors:
        for name, judge in JUDGES.items():
            for n, p in enumerate(pairs):
                if bool(judge(p["draft"], p["reference"])) != bool(p["label"]):
                    print(f"{name} wrong on pair {n} ({p['kind']}, label {p['label']}, claims "
                          f"{reply_claim(p['draft'])}/{reply_claim(p['reference'])}): {p['note'] or p['source']}")
    if args.runs:
        problems = check_verbatim(pairs, args.runs)
        print("\n".join(problems) or f"all {len(pairs)} pairs verbatim from {args.runs}")


if __name__ == "__main__":
    main()
