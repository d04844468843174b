"""Mining throughput: segments per second and the share of wall time spent inside the
drafter engine (target >= 90%: the pipeline must not be the bottleneck).

Strong trajectories: the built-in store domain solved by its scripted expert. Drafter:
SmolLM2-135M through transformers and (if installed) vLLM. Live environment, `match`
labeler. Prints figures measured in this one run.

    python bench/mining.py [--trajectories 4] [--engines transformers vllm]

With --ray the same mining runs three times through `specagent mine`'s own path
(`mine_from_config`): in one process, then on a local Ray cluster with 1 and with 2
actors (each actor asking for half the cores when there are 2), and prints each figure as a
ratio to the single process. `--engines scripted` is the store's expert with a fixed
latency per engine call (`--latency`): a stand-in for an engine that does not compete for
this machine's cores, which shows what the pool itself costs and gains.

    python bench/mining.py --ray --engines scripted transformers --trajectories 4
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from specagent.config import MineConfig
from specagent.core.classify import classify_tools
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Trajectory
from specagent.data.mine import mine_shard
from specagent.data.stage import MineWorker, mine_from_config
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy
from specagent.records.trajectories import write_trajectories
from specagent.runtime.drafting import DraftSettings, live_jobs

LATENCY_S = 0.05  # --engines scripted: seconds per engine call


def expert_trajectories(n: int) -> list[Trajectory]:
    env = StoreEnv()
    expert = ScriptedEngine(expert_policy(env), "expert")
    out = []
    for task in env.task_ids()[:: max(1, len(env.task_ids()) // n)][:n]:
        ep = run_episode(env, task, "strong", Models(strong=expert), ProtocolConfig(max_steps=16))
        out.append(Trajectory(f"store:{task}:0", task, env.tool_specs(), ep.messages, ep.reward, "bench", "expert"))
    return out


def build(engine: str):
    if engine == "transformers":
        from specagent.engines.transformers_engine import TransformersEngine

        return TransformersEngine("smollm2", max_model_len=4096, batch_size=8)
    from specagent.engines.vllm_engine import VLLMEngine

    return VLLMEngine("smollm2", max_model_len=4096, engine_kwargs={"enforce_eager": True})


def bench(engine_name: str, trajectories: list[Trajectory], settings: DraftSettings) -> dict:
    drafter = build(engine_name)

    def jobs_for(traj, cuts):
        return live_jobs(StoreEnv, traj, cuts, settings.max_draft_steps, classify_tools(traj.tools))

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path, stats = mine_shard(trajectories, drafter, jobs_for, settings, Path(tmp))
        wall = time.perf_counter() - start
        segments = sum(len(json.loads(line)["segments"]) for line in path.read_text().splitlines())
    close = getattr(drafter, "close", None)
    if close:
        close()
    return {"engine": engine_name, "segments": segments, "wall_s": wall, "engine_s": stats.seconds_in_engines,
            "segments_per_s": segments / wall, "share_in_engine": stats.seconds_in_engines / wall,
            "draft_calls": stats.draft_calls, "draft_tokens": stats.draft_tokens}


class SlowExpertWorker(MineWorker):
    """`specagent mine`'s worker with the expert as the drafter, LATENCY_S per engine call
    (defined in __main__, so Ray ships the class, and the latency, to its actors by value)."""

    def __init__(self, cfg, trajectories) -> None:
        super().__init__(cfg, trajectories)
        self.drafter = ScriptedEngine(expert_policy(StoreEnv()), "slow-expert", latency_s=LATENCY_S)


def mine_config(engine: str, trajectories: Path, out: Path, executor: dict, max_tokens: int,
                max_cuts: int | None, threads: int | None = None) -> MineConfig:
    drafter = {"backend": "scripted"} if engine == "scripted" else {"backend": engine, "model": "smollm2"}
    if threads is not None:
        drafter["threads"] = threads
    if engine == "vllm":
        drafter["engine_kwargs"] = {"enforce_eager": True}
    return MineConfig(trajectories=str(trajectories), output_dir=str(out), drafter=drafter, env={"name": "store"},
                      protocol={"max_draft_steps": 3, "max_tokens": max_tokens}, validation_fraction=0.0,
                      max_cuts_per_trajectory=max_cuts, executor=executor)


def bench_ray(engine: str, trajectories: list[Trajectory], max_tokens: int, max_cuts: int | None) -> list[dict]:
    """One process, then 1 and 2 Ray actors (the cores split between them), same mining.
    transformers also runs one process on 1 torch thread, what each of 2 actors gets (Ray
    sets an actor's OMP_NUM_THREADS to its num_cpus): on a busy machine one thread can be
    faster than two, and that, not Ray, would then be most of the 2 actors' gain."""
    cores = os.cpu_count() or 1
    runs = [("one process", {"kind": "local"}, None),
            ("ray, 1 actor", {"kind": "ray", "actors": 1, "num_cpus": cores}, None),
            ("ray, 2 actors", {"kind": "ray", "actors": 2, "num_cpus": cores / 2}, None)]
    if engine == "transformers":
        runs.insert(1, ("one process, 1 thread", {"kind": "local"}, 1))
    worker = SlowExpertWorker if engine == "scripted" else MineWorker
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trajectories.jsonl"
        write_trajectories(path, trajectories)
        for label, executor, threads in runs:
            cfg = mine_config(engine, path, Path(tmp) / label.replace(" ", "_").replace(",", ""), executor,
                              max_tokens, max_cuts, threads)
            start = time.perf_counter()
            stats = mine_from_config(cfg, worker=worker)
            wall = time.perf_counter() - start
            out.append({"engine": engine, "run": label, "segments": stats["all"]["segments"], "wall_s": wall,
                        "segments_per_s": stats["all"]["segments"] / wall})
    return out


def print_ray(results: list[dict]) -> None:
    base = results[0]["segments_per_s"]
    for r in results:
        print(f"{r['engine']:>12} {r['run']:>21}: {r['segments']} segments in {r['wall_s']:.1f}s = "
              f"{r['segments_per_s']:.3f} segments/s = {r['segments_per_s'] / base:.2f}x one process")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=4)
    parser.add_argument("--engines", nargs="+", default=["transformers", "vllm"])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--ray", action="store_true", help="one process vs 1 and 2 Ray actors, through `specagent mine`")
    parser.add_argument("--max-cuts", type=int, help="--ray: cut points per trajectory (default: every one)")
    parser.add_argument("--latency", type=float, default=LATENCY_S, help="--engines scripted: seconds per engine call")
    args = parser.parse_args()
    LATENCY_S = args.latency
    trajs = expert_trajectories(args.trajectories)
    if args.ray:
        import ray

        # started once for all runs, so a run's figure is its mining (engines loaded in the actors included)
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        for name in args.engines:
            print_ray(bench_ray(name, trajs, args.max_tokens, args.max_cuts))
        ray.shutdown()
    else:
        settings = DraftSettings(max_draft_steps=3, max_tokens=args.max_tokens)
        for name in args.engines:
            r = bench(name, trajs, settings)
            print(f"{r['engine']:>12}: {r['segments']} segments in {r['wall_s']:.1f}s = {r['segments_per_s']:.3f} segments/s; "
                  f"inside the engine {r['engine_s']:.1f}s = {r['share_in_engine']:.1%} of wall (target >= 90%); "
                  f"{r['draft_calls']} draft calls, {r['draft_tokens']} tokens")
