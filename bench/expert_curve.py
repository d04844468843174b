"""S's eval success against its training steps: every checkpoint of a training output,
merged and run on the same eval tasks, with the pipeline's own commands.

For each `checkpoint-N` (and the final `adapter/`): `specagent export <it> --merge
--skip-smoke`, then `specagent eval` of the merged model (arm `strong`) on every
``--stride``-th task of the store's eval split (ticket mode by default). Writes
`<out>/curve.json` (success with its 95% interval per step) and `<out>/curve.png`.
Resumable: an export or eval already on disk is reused.

    python bench/expert_curve.py --run runs/store/train/strong --stride 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkpoints(run: Path) -> list[tuple[int, Path]]:
    """(training step, dir) of every checkpoint and of the final adapter."""
    found = [(int(p.name.split("-")[1]), p) for p in run.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    metrics = run / "metrics.json"
    final = run / "adapter" if (run / "adapter").is_dir() else run / "model"
    if final.is_dir() and metrics.is_file():
        step = json.loads(metrics.read_text()).get("global_step")
        if step is not None and step not in {s for s, _ in found}:
            found.append((step, run))
    return sorted(found)


def specagent(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "specagent", *args], cwd=ROOT, check=True)


def is_full_model(source: Path) -> bool:
    """A full fine-tune's checkpoint (or `model/`): no adapter to merge."""
    return not (source / "adapter_config.json").is_file() and not (source / "adapter").is_dir()


def success_at(step: int, source: Path, out: Path, task_ids: list[str], args: argparse.Namespace) -> dict:
    export, full = out / f"export-{step}", is_full_model(source)
    weights = export / ("model" if full else "merged")
    if not (weights / "config.json").is_file():
        specagent("export", str(source), "-o", str(export), "--skip-smoke", *([] if full else ["--merge"]))
    evaluation = out / f"eval-{step}"
    if not (evaluation / "report.json").is_file():
        specagent("eval", "-c", args.config, f"strong.model={weights}", "arms=[{name: strong, mode: strong}]",
                  f"env.task_ids={json.dumps(task_ids)}", f"env.user={args.user}", f"output_dir={evaluation}",
                  f"concurrency={args.concurrency}", *([f"env.per_kind={args.per_kind}"] if args.per_kind else []))
    report = json.loads((evaluation / "report.json").read_text())
    return {"step": step, **report["arms"]["strong"]["success"], "git_sha": (report.get("versions") or {}).get("git_sha")}


def eval_tasks(args: argparse.Namespace) -> list[str]:
    """The eval split's tasks of the config's kinds (all of them when it names none), with
    `--per-kind` generated ones of each kind."""
    from specagent.config import EvalConfig, load_config
    from specagent.runtime.assembly import build_env, select_tasks

    env = load_config(EvalConfig, args.config).env
    env = env.model_copy(update={"split": "eval", "per_kind": args.per_kind, "task_ids": None, "limit": None})
    return select_tasks(build_env(env), env)


def plot(curves: list[tuple[str, list[dict]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (label, points) in enumerate(curves):
        dodge = (i - (len(curves) - 1) / 2) * 0.3  # curves that coincide stay visible side by side
        steps = [p["step"] + dodge for p in points]
        means = [p["mean"] for p in points]
        low = [p["mean"] - p["lo"] for p in points]
        high = [p["hi"] - p["mean"] for p in points]
        ax.errorbar(steps, means, yerr=[low, high], marker="o", capsize=3, label=label)
    ax.set(xlabel="training step (8 demonstrations each)", ylabel="eval success (95% interval)", ylim=(0, 1),
           title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="runs/store/train/strong", help="a `specagent train drafter` output dir")
    parser.add_argument("--config", default="configs/eval/store_expert_vllm.yaml")
    parser.add_argument("--stride", type=int, default=3, help="every k-th task of the eval split")
    parser.add_argument("--user", choices=["ticket", "multi_turn"], default="ticket")
    parser.add_argument("--per-kind", type=int, default=None,
                        help="generated eval tasks per kind (env.per_kind); the config's env.kinds are kept")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default="runs/bench/expert-curve")
    parser.add_argument("--overlay", action="append", default=[], metavar="CURVE_JSON",
                        help="another run's curve.json, drawn in the same plot (repeatable)")
    args = parser.parse_args()

    task_ids = eval_tasks(args)[:: args.stride]
    out = Path(args.out) / args.user
    out.mkdir(parents=True, exist_ok=True)
    began, points = time.perf_counter(), []
    for step, source in checkpoints(Path(args.run)):
        points.append(success_at(step, source, out, task_ids, args))
        print(f"step {step}: success {points[-1]['mean']:.2f} [{points[-1]['lo']:.2f}, {points[-1]['hi']:.2f}]")
    result = {"run": args.run, "user": args.user, "tasks": len(task_ids), "stride": args.stride, "points": points,
              "seconds": round(time.perf_counter() - began, 1), "git_sha": points[-1]["git_sha"] if points else None}
    (out / "curve.json").write_text(json.dumps(result, indent=2))
    others = [json.loads(Path(p).read_text()) for p in args.overlay]
    curves = [(Path(c["run"]).name, c["points"]) for c in [result, *others]]
    plot(curves, out / "curve.png", f"S on {len(task_ids)} store eval tasks ({args.user})")
    print(f"{out / 'curve.json'}  {out / 'curve.png'}")


if __name__ == "__main__":
    main()
