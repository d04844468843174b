"""Edge–cloud, measured: S behind a local vLLM OpenAI-compatible server, the drafter local.

Starts a vLLM server for the strong model (`vllm_server.start_server`: specagent's chat
template, prefix caching, the CPU KV cache sized), runs the eval config against it (arms of
`configs/eval/quickstart_edge_cloud.yaml`: S alone over the network, W alone locally, and S
reviewing the local drafter's segments with its likelihood verdict through
`prompt_logprobs`), stops the server, and prints what crossed the network per arm: requests,
prompt and completion tokens, bytes both ways, each against the `strong` arm.

    python bench/edge_cloud.py --strong runs/quickstart/export/strong/merged \\
        [-c configs/eval/quickstart_edge_cloud.yaml] [key=value ...]

The eval's report (`report.md`, `report.json`, plots) lands in the config's `output_dir`;
`--out` gets the network table as JSON (for `bench/record.py`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specagent.config import EvalConfig, load_config
from specagent.engines.vllm_server import start_server
from specagent.eval.matrix import eval_from_config

FIELDS = ("requests", "prompt_tokens", "completion_tokens", "bytes_sent", "bytes_received")


def network_table(report: dict) -> dict[str, dict[str, float]]:
    """arm -> the network totals of its episodes, plus each field's ratio to the `strong` arm."""
    arms = {name: arm["network"]["total"] for name, arm in report["arms"].items()}
    base = arms.get("strong")
    table = {}
    for name, totals in arms.items():
        row = {f: totals[f] for f in FIELDS}
        if base:
            row.update({f"{f}_ratio": (totals[f] / base[f] if base[f] else None) for f in FIELDS})
        table[name] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", default="configs/eval/quickstart_edge_cloud.yaml")
    parser.add_argument("--strong", default="runs/quickstart/export/strong/merged", help="the model dir the server loads")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--out", default="runs/bench/edge_cloud.json")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the eval config")
    args = parser.parse_args()

    print(f"starting a vLLM server for {args.strong} ...", flush=True)
    with start_server(args.strong, served_model_name="strong", max_model_len=args.max_model_len,
                      extra_args=["--enforce-eager", "--block-size", "32"]) as server:
        cfg = load_config(EvalConfig, args.config, [*args.overrides, f"strong.base_url={server.base_url}/v1",
                                                    "strong.model=strong", f"strong.tokenizer={args.strong}"])
        report = eval_from_config(cfg)
    table = network_table(report)
    print(f"\n{'arm':<12}" + "".join(f"{f:>20}" for f in FIELDS))
    for name, row in table.items():
        ratios = [row.get(f"{f}_ratio") for f in FIELDS]  # None: the strong arm had none of it
        cells = "".join(f"{row[f]:>12,.0f} ({'–' if r is None else f'{r:.2f}':>4})" for f, r in zip(FIELDS, ratios))
        print(f"{name:<12}{cells}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": args.config, "strong": args.strong, "network": table,
                                          "report": str(Path(cfg.output_dir) / "report.json")}, indent=1))
    print(f"\nnetwork table: {args.out}   report: {cfg.output_dir}/report.md")


if __name__ == "__main__":
    main()
