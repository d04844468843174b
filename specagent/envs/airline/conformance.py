"""Does the live airline environment reproduce tau-bench? Checked against recorded runs.

    python -m specagent.envs.airline.conformance --data ../shared/data/tau-bench-airline

1. Tool calls: every recorded call of every run, replayed in order on a fresh database
   per run, must return the recorded observation, character for character.
2. Gold hashes: each task's gold actions on a fresh database must give the
   ``gt_data_hash`` its runs record (tau-bench records it for tasks without required
   outputs; for the others it records the output check instead, and a run it graded 1.0
   that re-grades to 1.0 here confirms the gold hash).
3. Rewards: each graded run, replayed, must earn its recorded reward.

Prints the figures and every miss with its reason; exits 1 if anything missed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from specagent.core.errors import ConfigError
from specagent.core.types import Message
from specagent.envs.airline.env import AirlineEnv


@dataclass
class Report:
    calls: int = 0
    calls_matched: int = 0
    call_misses: list[str] = field(default_factory=list)
    hash_tasks: list[str] = field(default_factory=list)  # tasks whose runs record a gold hash
    hash_misses: list[str] = field(default_factory=list)
    solved_tasks: set[str] = field(default_factory=set)  # a run graded 1.0 re-grades to 1.0
    graded_runs: int = 0
    reward_misses: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.call_misses or self.hash_misses or self.reward_misses)


def run_label(run: dict[str, Any]) -> str:
    return f"task {run['task_id']} trial {run.get('trial')}"


def difference(expected: str, got: str) -> str:
    """Where two observations part: the first differing character, with some context."""
    at = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    start = max(at - 40, 0)
    return (f"differs at character {at} (lengths {len(expected)} vs {len(got)}): "
            f"recorded {expected[start:at + 60]!r}, got {got[start:at + 60]!r}")


def replay_run(env: AirlineEnv, run: dict[str, Any], report: Report) -> list[Message]:
    """Replay one run's calls on a fresh database, counting matches; returns its messages."""
    env.reset(str(run["task_id"]))
    messages = [Message.from_openai(m) for m in run["traj"]]
    for index, message in enumerate(messages):
        answers: dict[str | None, str] = {}
        for after in messages[index + 1:]:  # call ids are only unique within one turn
            if after.role != "tool":
                break
            answers.setdefault(after.tool_call_id, after.content or "")
        for call in message.tool_calls:
            got, expected = env.execute(call), answers.get(call.id)
            report.calls += 1
            if got == expected:
                report.calls_matched += 1
                continue
            reason = "no recorded observation" if expected is None else difference(expected, got)
            report.call_misses.append(f"{run_label(run)}, message {index}, {call.name}: {reason}")
    return messages


def recorded_gold_hash(run: dict[str, Any]) -> str | None:
    info = (run["info"].get("reward_info") or {}).get("info") or {}
    return info.get("gt_data_hash")


def check(env: AirlineEnv, runs: Sequence[dict[str, Any]]) -> Report:
    report = Report()
    for run in runs:
        messages = replay_run(env, run, report)
        if run["info"].get("reward_info") is None:
            continue  # tau-bench never graded it (the run hit its step limit)
        report.graded_runs += 1
        reward = env.reward(messages)
        if reward.reward != run["reward"]:
            report.reward_misses.append(f"{run_label(run)}: recorded reward {run['reward']}, "
                                        f"re-graded {reward.reward} ({reward.info})")
        elif reward.reward == 1.0:
            report.solved_tasks.add(str(run["task_id"]))
    for task_id in env.task_ids():
        recorded = {recorded_gold_hash(r) for r in runs if str(r["task_id"]) == task_id} - {None}
        if not recorded:
            continue
        report.hash_tasks.append(task_id)
        gold = env.gold_hash(task_id)
        if recorded != {gold}:
            report.hash_misses.append(f"task {task_id}: recorded {sorted(recorded)}, gold actions give {gold}")
    return report


def render(report: Report, env: AirlineEnv) -> str:
    unhashed = [t for t in env.task_ids() if t not in report.hash_tasks]
    by_reward = ", ".join(t for t in unhashed if t in report.solved_tasks) or "none"
    unchecked = ", ".join(t for t in unhashed if t not in report.solved_tasks) or "none"
    hashes_matched = len(report.hash_tasks) - len(report.hash_misses)
    rewards_matched = report.graded_runs - len(report.reward_misses)
    share = 100 * report.calls_matched / max(report.calls, 1)
    lines = [
        f"tool calls reproduced: {report.calls_matched}/{report.calls} ({share:.1f}%)",
        (f"gold hashes: {hashes_matched}/{len(report.hash_tasks)} tasks match their recorded gt_data_hash; "
         f"without one (their runs record output checks), confirmed by a run graded 1.0: {by_reward}; "
         f"unchecked: {unchecked}"),
        f"rewards: {rewards_matched}/{report.graded_runs} graded runs re-grade to their recorded reward",
    ]
    for title, misses in (("tool-call misses", report.call_misses), ("gold-hash misses", report.hash_misses),
                          ("reward misses", report.reward_misses)):
        if misses:
            lines += [f"{title} ({len(misses)}):"] + [f"  - {miss}" for miss in misses]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specagent.envs.airline.conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the tau-bench airline data dir (database + runs)")
    parser.add_argument("--runs", help="the runs file (default: the one runs *.json in --data)")
    args = parser.parse_args(argv)
    try:
        env = AirlineEnv(args.data, args.runs)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    report = check(env, env.data.runs)
    print(render(report, env))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
