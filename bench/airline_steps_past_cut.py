"""Which of GPT-4o's steps a drafter row cut at `max_length` tokens never trains, by tool.

GPT-4o's airline runs of the training tasks (0-19, every trial), rendered as the drafter's
training rows are (specagent's template, a prompt profile, the SmolLM2 tokenizer): a step whose
context alone already reaches the limit carries no loss in an SFT row cut there.

    python bench/airline_steps_past_cut.py [--profile compact] [--limits 4096 8192] [--out runs/bench/x.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from specagent.data.importers import convert_files
from specagent.engines.models import materialize
from specagent.engines.render import load_tokenizer, profile_named, render_prompt

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT.parent / "shared" / "data" / "tau-bench-airline" / "gpt-4o-trajectories-tasks-00-24.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=str(RUNS))
    parser.add_argument("--tools", default=str(ROOT / "configs" / "import" / "tau_airline_tools.yaml"))
    parser.add_argument("--held-out", nargs="+", default=["20", "21", "22", "23", "24"])
    parser.add_argument("--profile", default="compact")
    parser.add_argument("--limits", nargs="+", type=int, default=[4096, 8192])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    runs, _ = convert_files([args.runs], tools_yaml=args.tools, model="gpt-4o")
    tokenizer, profile = load_tokenizer(materialize("smollm2")), profile_named(args.profile)
    steps = collections.Counter()
    past = {limit: collections.Counter() for limit in args.limits}
    for run in (r for r in runs if r.task_id not in args.held_out):
        for i, message in enumerate(run.messages):
            if message.role != "assistant":
                continue
            context = len(tokenizer(render_prompt(tokenizer, run.messages[:i], run.tools, profile=profile))["input_ids"])
            kind = message.tool_calls[0].name if message.tool_calls else "reply"
            steps[kind] += 1
            for limit in args.limits:
                past[limit][kind] += context >= limit
    table = {"command": " ".join(sys.argv), "profile": args.profile, "steps": dict(steps),
             "past": {str(limit): dict(counts) for limit, counts in past.items()}}
    print(f"{'step':<32} {'steps':>5} " + " ".join(f"{'past ' + str(limit):>10}" for limit in args.limits))
    for kind, n in steps.most_common():
        print(f"{kind:<32} {n:>5} " + " ".join(f"{past[limit][kind]:>10}" for limit in args.limits))
    print(f"{'all':<32} {sum(steps.values()):>5} " + " ".join(f"{sum(past[limit].values()):>10}" for limit in args.limits))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
