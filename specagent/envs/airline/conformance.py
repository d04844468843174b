"""Does the live airline environment reproduce tau-bench? Checked against recorded runs.

    python -m specagent.envs.airline.conformance --data ../shared/data/tau-bench-airline [--allow-unchecked]

Every run of the runs file is counted, and checked on each kind its record allows:

- records: the run can be read (task_id, traj, info.task; every message has a role; every
  call a name and arguments that are a JSON object; a graded run's reward agrees with its
  reward_info). A bad record is a failure named by run and message index; the run's
  other checks are then skipped, its calls included.
- tool calls: each recorded call, replayed in order on a fresh database per run, returns
  the recorded observation, character for character.
- gold hash: where a run records tau-bench's ``gt_data_hash`` (tasks without required
  outputs), the task's gold actions on a fresh database give that hash.
- final database: where a run's record says whether its final database matched the gold
  one (``r_actions``; for tasks with outputs, ``r_outputs`` 1.0 with the reward then
  telling), the replayed run's final database agrees.
- outputs: where a run records its output checks, re-grading the replay gives the same.
- reward: a graded run, replayed, earns its recorded reward.

A check a run's record does not allow is skipped, and each run with skipped checks is
listed with the reason (e.g. tau-bench never graded it: no ``info.reward_info``).

Tasks: each task's gold hash must be confirmed, by a recorded ``gt_data_hash`` or by a
run whose record says its final database matched the gold one and whose replay agrees.
A task no run confirms is unchecked, and fails the check unless ``--allow-unchecked``.

Prints the counts of each kind (checked, skipped, failed), every skipped run and every
failure with its reason. Exit status: 0 only when every check that ran passed and no task
is unchecked (or unchecked ones are allowed); 1 otherwise; 2 when the data cannot be
loaded at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from specagent.core.errors import ConfigError
from specagent.core.types import Message, ToolCall
from specagent.envs.airline.env import AirlineEnv

KINDS = ("records", "tool calls", "gold hash", "final database", "outputs", "reward")


@dataclass
class Tally:
    """One kind of check: how many ran (``checked``, failures included), how many a record
    did not allow (``skipped``), and each failure's text."""

    checked: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return len(self.failures)

    def passed(self) -> None:
        self.checked += 1

    def failed_with(self, text: str) -> None:
        self.checked += 1
        self.failures.append(text)


@dataclass
class Report:
    runs: int = 0
    kinds: dict[str, Tally] = field(default_factory=lambda: {kind: Tally() for kind in KINDS})
    skipped_runs: list[str] = field(default_factory=list)  # "run [i] (...): kinds: why"
    tasks: list[str] = field(default_factory=list)
    confirmed: dict[str, str] = field(default_factory=dict)  # task -> how its gold hash is confirmed
    failed_tasks: set[str] = field(default_factory=set)  # a gold-hash or final-database check of theirs failed
    allow_unchecked: bool = False

    @property
    def unchecked(self) -> list[str]:
        return [task for task in self.tasks if task not in self.confirmed and task not in self.failed_tasks]

    @property
    def failed(self) -> int:
        return sum(tally.failed for tally in self.kinds.values())

    @property
    def ok(self) -> bool:
        return self.failed == 0 and (self.allow_unchecked or not self.unchecked)


class BadRecord(Exception):
    """A run record that cannot be checked; the message says where and why."""


def run_label(index: int, run: Any) -> str:
    if not isinstance(run, dict) or "task_id" not in run:
        return f"run [{index}]"
    return f"run [{index}] (task {run['task_id']}, trial {run.get('trial', '?')})"


def difference(expected: str, got: str) -> str:
    """Where two observations part: the first differing character, with some context."""
    at = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    start = max(at - 40, 0)
    return (f"differs at character {at} (lengths {len(expected)} vs {len(got)}): "
            f"recorded {expected[start:at + 60]!r}, got {got[start:at + 60]!r}")


def _snippet(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_call(raw: Any, where: str) -> ToolCall:
    """One recorded tool call; arguments must be a JSON object (tau-bench's agent could make
    no action of anything else), given as JSON text or already decoded."""
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        raise BadRecord(f"{where}: not a {{id, function: {{name, arguments}}}} object: {_snippet(raw)}")
    function = raw["function"]
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str):
        raise BadRecord(f"{where}: the call has no function name")
    where = f"{where} ({name})"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            text = _snippet(function["arguments"])
            raise BadRecord(f"{where}: arguments are not valid JSON ({exc}): {text}") from None
    if not isinstance(arguments, dict):
        raise BadRecord(f"{where}: arguments are not a JSON object: {_snippet(arguments)}")
    call_id = raw.get("id")
    if not isinstance(call_id, str):
        raise BadRecord(f"{where}: the call has no id")
    return ToolCall(id=call_id, name=name, arguments=arguments)


def parse_message(raw: Any, where: str) -> Message:
    if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
        raise BadRecord(f"{where}: not a message with a role: {_snippet(raw)}")
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        raise BadRecord(f"{where}: content is not a string: {_snippet(content)}")
    calls = raw.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadRecord(f"{where}: tool_calls is not a list")
    tool_call_id = raw.get("tool_call_id")
    if raw["role"] == "tool" and not isinstance(tool_call_id, str):
        raise BadRecord(f"{where}: a tool message without a tool_call_id")
    return Message(
        role=raw["role"], content=content,
        tool_calls=tuple(parse_call(c, f"{where}, tool call {k}") for k, c in enumerate(calls)),
        tool_call_id=tool_call_id, name=raw.get("name") if isinstance(raw.get("name"), str) else None,
    )


def grading(run: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The run's ``reward_info.info`` (tau-bench's grading), or None if it was never graded."""
    reward_info = run["info"].get("reward_info")
    if reward_info is None:
        return None
    if not isinstance(reward_info, dict) or not isinstance(reward_info.get("info"), dict):
        raise BadRecord(f"{label}: info.reward_info is not an object with an info object")
    reward = run.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise BadRecord(f"{label}: graded (info.reward_info) but its reward is {_snippet(reward)}, not a number")
    if reward_info.get("reward", reward) != reward:
        raise BadRecord(f"{label}: records reward {reward} but reward_info.reward {reward_info['reward']}")
    return reward_info["info"]


def replay(env: AirlineEnv, run: dict[str, Any], label: str, report: Report) -> list[Message]:
    """Replay one run's calls on a fresh database, counting each; returns its messages.
    The whole record is read first: a bad one replays nothing (its calls count as skipped)."""
    raw = run["traj"]
    try:
        messages = [parse_message(item, f"{label}, message {index}") for index, item in enumerate(raw)]
    except BadRecord:
        report.kinds["tool calls"].skipped += _count_calls(run)
        raise
    env.reset(str(run["task_id"]))
    calls = report.kinds["tool calls"]
    for index, message in enumerate(messages):
        if not message.tool_calls:
            continue
        answers: dict[str | None, str] = {}
        for after in messages[index + 1:]:  # call ids are only unique within one turn
            if after.role != "tool":
                break
            answers.setdefault(after.tool_call_id, after.content or "")
        for call in message.tool_calls:
            got, expected = env.execute(call), answers.get(call.id)
            if got == expected:
                calls.passed()
                continue
            reason = "no recorded observation" if expected is None else difference(expected, got)
            calls.failed_with(f"{label}, message {index}, {call.name}: {reason}")
    return messages


def check_run(env: AirlineEnv, index: int, run: Any, report: Report) -> None:
    label = run_label(index, run)
    kinds = report.kinds

    def skip(names: Sequence[str], why: str) -> None:
        for name in names:
            kinds[name].skipped += 1
        report.skipped_runs.append(f"{label}: {', '.join(names)} skipped: {why}")

    if index in env.data.rejected:
        kinds["records"].failed_with(f"{label}: {env.data.rejected[index]}")
        kinds["tool calls"].skipped += _count_calls(run)
        skip(("final database", "reward"), "its record cannot be read (see the failures)")
        return
    task_id = str(run["task_id"])
    has_outputs = bool(env.task_record(task_id)["outputs"])
    # the kinds that apply to this run after its calls: tau-bench records a gold hash for
    # tasks without required outputs, and output checks for the others
    later = ("outputs" if has_outputs else "gold hash", "final database", "reward")
    try:
        messages = replay(env, run, label, report)
        info = grading(run, label)
    except BadRecord as bad:
        kinds["records"].failed_with(str(bad))
        skip(later, "its record is bad (see the failures)")
        return
    kinds["records"].passed()
    if info is None:
        skip(later, "tau-bench never graded it (no info.reward_info; e.g. it hit the step limit)")
        return
    reward = env.reward(messages)
    skipped: list[tuple[str, str]] = []
    gold = env.gold_hash(task_id)

    # gold hash: tau-bench records it for tasks without required outputs
    if "gt_data_hash" in info:
        if info["gt_data_hash"] == gold:
            kinds["gold hash"].passed()
            report.confirmed.setdefault(task_id, "a recorded gt_data_hash")
        else:
            report.failed_tasks.add(task_id)
            kinds["gold hash"].failed_with(f"{label}: records gt_data_hash {info['gt_data_hash']}, "
                                           f"the gold actions give {gold}")
    elif not has_outputs:
        skipped.append(("gold hash", "it records no gt_data_hash"))

    # final database: does the record say whether it matched the gold one?
    if "r_actions" in info:
        recorded_match: bool | None = bool(info["r_actions"])
    elif info.get("r_outputs") == 1.0:
        recorded_match = run["reward"] == 1.0  # every output was said: the reward is the database check
    else:
        recorded_match = None
    if recorded_match is None:
        skipped.append(("final database", "its record does not say whether its final database matched "
                                          "(outputs were missed, so its reward does not tell)"))
    elif recorded_match == reward.info["db_match"]:
        kinds["final database"].passed()
        if recorded_match:
            report.confirmed.setdefault(task_id, f"{label}, whose final database matched it")
    else:
        report.failed_tasks.add(task_id)
        kinds["final database"].failed_with(
            f"{label}: recorded that its final database {'matched' if recorded_match else 'did not match'} "
            f"the gold one; replayed, it {'does' if reward.info['db_match'] else 'does not'} "
            f"(final {reward.info['final_hash']}, gold {gold})")

    # outputs: tasks with required outputs record their check
    if "outputs" in info:
        if info["outputs"] == reward.info["outputs"]:
            kinds["outputs"].passed()
        else:
            kinds["outputs"].failed_with(f"{label}: recorded outputs {info['outputs']}, "
                                         f"re-graded {reward.info['outputs']}")
    elif has_outputs:
        skipped.append(("outputs", "it records no output checks"))

    if reward.reward == run["reward"]:
        kinds["reward"].passed()
    else:
        kinds["reward"].failed_with(f"{label}: recorded reward {run['reward']}, re-graded {reward.reward} "
                                    f"({reward.info})")
    for name, why in skipped:
        skip([name], why)


def _count_calls(run: Any) -> int:
    traj = run.get("traj") if isinstance(run, dict) else None
    if not isinstance(traj, list):
        return 0
    return sum(len(m["tool_calls"]) for m in traj if isinstance(m, dict) and isinstance(m.get("tool_calls"), list))


def check(env: AirlineEnv, runs: Sequence[Any], allow_unchecked: bool = False) -> Report:
    report = Report(runs=len(runs), tasks=env.task_ids(), allow_unchecked=allow_unchecked)
    for index, run in enumerate(runs):
        try:
            check_run(env, index, run, report)
        except Exception as exc:  # noqa: BLE001 - a record no check foresaw is a failure, never a traceback
            report.kinds["records"].failed_with(f"{run_label(index, run)}: cannot be checked "
                                                f"({type(exc).__name__}: {exc})")
    return report


def render(report: Report) -> str:
    kinds = report.kinds
    unchecked = report.unchecked
    lines = [f"runs: {report.runs}"]
    for name in KINDS:
        tally = kinds[name]
        lines.append(f"{name}: {tally.checked - tally.failed}/{tally.checked} passed, "
                     f"{tally.failed} failed, {tally.skipped} skipped")
    by_how: dict[str, list[str]] = {}
    for task, how in report.confirmed.items():
        by_how.setdefault("a run whose final database matched" if how.startswith("run") else how, []).append(task)
    confirmed = "; ".join(f"{len(tasks)} by {how}" for how, tasks in by_how.items()) or "none"
    failed_tasks = [task for task in report.tasks if task in report.failed_tasks]
    lines.append(f"tasks: {len(report.tasks)}: gold hash confirmed for {len(report.confirmed)} ({confirmed}); "
                 f"failed: {', '.join(failed_tasks) or 'none'}; unchecked: {', '.join(unchecked) or 'none'}")
    if report.skipped_runs:
        lines += [f"runs with skipped checks ({len(report.skipped_runs)}):"]
        lines += [f"  - {line}" for line in report.skipped_runs]
    for name in KINDS:
        if kinds[name].failures:
            lines += [f"{name} failures ({kinds[name].failed}):"] + [f"  - {text}" for text in kinds[name].failures]
    per_kind = "; ".join(f"{name} {kinds[name].checked}/{kinds[name].skipped}/{kinds[name].failed}" for name in KINDS)
    tasks = f"{len(report.tasks) - len(unchecked)}/{len(unchecked)}/{len(failed_tasks)}"
    lines.append(f"summary (checked/skipped/failed): {per_kind}; tasks {tasks} (skipped: unchecked)")
    if report.failed:
        verdict = f"FAIL: {report.failed} check(s) failed"
        if unchecked:
            verdict += f"; {len(unchecked)} task(s) unchecked: {', '.join(unchecked)}"
    elif unchecked and not report.allow_unchecked:
        verdict = (f"FAIL: {len(unchecked)} task(s) unchecked: {', '.join(unchecked)} (no run records their gold "
                   "hash or a final database that matched it); --allow-unchecked accepts them")
    elif unchecked:
        verdict = f"PASS, with {len(unchecked)} task(s) unchecked (allowed): {', '.join(unchecked)}"
    else:
        verdict = "PASS"
    lines.append(f"result: {verdict}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specagent.envs.airline.conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the tau-bench airline data dir (database + runs)")
    parser.add_argument("--runs", help="the runs file (default: the one runs *.json in --data)")
    parser.add_argument("--allow-unchecked", action="store_true",
                        help="pass even if some task's gold hash no run confirms (they are still listed)")
    args = parser.parse_args(argv)
    try:
        env = AirlineEnv(args.data, args.runs, strict=False)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    report = check(env, env.data.runs, allow_unchecked=args.allow_unchecked)
    print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
