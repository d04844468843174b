"""Mining throughput: segments per second and the share of wall time spent inside the
drafter engine (target >= 90%: the pipeline must not be the bottleneck).

Strong trajectories: the built-in store domain solved by its scripted expert. Drafter:
SmolLM2-135M through transformers and (if installed) vLLM. Live environment, `match`
labeler. Prints figures measured in this one run.

    python bench/mining.py [--trajectories 4] [--engines transformers vllm]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from specagent.core.classify import classify_tools
from specagent.core.protocol import Models, ProtocolConfig, run_episode
from specagent.core.types import Trajectory
from specagent.data.mine import mine_shard
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy
from specagent.runtime.drafting import DraftSettings, live_jobs


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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=4)
    parser.add_argument("--engines", nargs="+", default=["transformers", "vllm"])
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    trajs = expert_trajectories(args.trajectories)
    settings = DraftSettings(max_draft_steps=3, max_tokens=args.max_tokens)
    for name in args.engines:
        r = bench(name, trajs, settings)
        print(f"{r['engine']:>12}: {r['segments']} segments in {r['wall_s']:.1f}s = {r['segments_per_s']:.3f} segments/s; "
              f"inside the engine {r['engine_s']:.1f}s = {r['share_in_engine']:.1%} of wall (target >= 90%); "
              f"{r['draft_calls']} draft calls, {r['draft_tokens']} tokens")
