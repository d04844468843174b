"""Bad input and resume (issue 12, class 8), through the real CLI on hostile files made here.

Every refusal is exit code 2 with one `error:` line that names the file (and the line, where
there is one), no traceback, and the output left exactly as it was: no new file, no
config.yaml overwritten. Scripted models and the store environment only: nothing loads a model.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specagent.cli import main
from specagent.config import DrafterTrainConfig, VerdictTrainConfig, dump_config

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "configs/run/store_scripted.yaml"
MCP_RUN = ROOT / "configs/run/store_mcp_scripted.yaml"
EVAL = ROOT / "configs/eval/store_scripted.yaml"
COLLECT = ROOT / "configs/collect/store_scripted.yaml"
TOOLS = ROOT / "configs/import/tau_airline_tools.yaml"
NO_MODEL = "/nonexistent/model"  # training refusals must come before any model loads

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------- helpers


def cli(*argv) -> tuple[int, str, str]:
    """`specagent ARGV` in this process: (exit code, stdout, stderr). An exception that escapes
    `main` (what a user sees as a traceback) fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def assert_refused(result: tuple[int, str, str], *named: str) -> str:
    """Exit code 2 and exactly one `error:` line, which holds every string of ``named``."""
    code, _, err = result
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for text in named:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def snapshot(path: Path) -> dict[str, bytes] | None:
    """Every file under ``path`` (or ``path`` itself) with its bytes; None when nothing is there."""
    if not path.exists():
        return None
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# bytes that are not UTF-8 (and hold no line break, so the line they land on is known); between
# two ASCII bytes no neighbour can complete them into a valid sequence
NOT_UTF8 = st.binary(min_size=1, max_size=6).filter(lambda b: not is_utf8(b) and b"\n" not in b and b"\r" not in b)


def ascii_gaps(data: bytes) -> list[int]:
    """Offsets between two ASCII bytes (or at either end) of ``data``."""
    return [i for i in range(len(data) + 1)
            if (i == 0 or data[i - 1] < 0x80) and (i == len(data) or data[i] < 0x80)]


def insert_bad_bytes(data: bytes, draw) -> tuple[bytes, int]:
    """``data`` with bytes that are not UTF-8 inserted at a drawn place; and the line they are on."""
    bad = draw(NOT_UTF8, label="bad bytes")
    at = draw(st.sampled_from(ascii_gaps(data)), label="offset")
    return data[:at] + bad + data[at:], data.count(b"\n", 0, at) + 1


# --------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory) -> Path:
    """A trajectories.jsonl of 3 scripted store runs (`specagent collect`)."""
    out = tmp_path_factory.mktemp("collected") / "trajectories.jsonl"
    assert cli("collect", "-c", COLLECT, f"output={out}", "env.limit=3")[0] == 0
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory, trajectories) -> dict[str, tuple[Path, Path, list[str]]]:
    """Finished scripted work to resume, per command: (its dir, its episodes file, its argv)."""
    base = tmp_path_factory.mktemp("finished")
    made = {
        "run": (base / "run", base / "run" / "episodes.jsonl",
                ["run", "-c", RUN, f"output_dir={base / 'run'}", "env.limit=4"]),
        "eval": (base / "eval", base / "eval" / "episodes.jsonl",
                 ["eval", "-c", EVAL, f"output_dir={base / 'eval'}", "env.limit=1"]),
        "collect": (base / "collect", base / "collect" / "t.episodes.jsonl",
                    ["collect", "-c", COLLECT, f"output={base / 'collect' / 't.jsonl'}", "env.limit=4"]),
    }
    for _, episodes, argv in made.values():
        assert cli(*argv)[0] == 0
        assert len(episodes.read_text().splitlines()) == 4
    return made


def copy_of(finished_entry, tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """A fresh copy of finished work, and the argv that resumes it there."""
    source, episodes, argv = finished_entry
    target = tmp_path_factory.mktemp("copy") / source.name
    shutil.copytree(source, target)
    return target, target / episodes.relative_to(source), [str(a).replace(str(source), str(target)) for a in argv]


# --------------------------------------------------------------------- files that are not UTF-8


def _tasks_yaml(path: Path) -> bytes:
    tasks = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return yaml.safe_dump(tasks, sort_keys=False).encode()


# name -> (the valid file's bytes and suffix, given the trajectories file; the argv reading `bad` into `out`)
NOT_UTF8_CASES = {
    "config -c": (lambda t: (RUN.read_bytes(), ".yaml"),
                  lambda bad, out, t: ["run", "-c", bad, f"output_dir={out}"]),
    "import --tools": (lambda t: (TOOLS.read_bytes(), ".yaml"),
                       lambda bad, out, t: ["import", t, "-o", out / "t.jsonl", "--tools", bad]),
    "store env.tasks_path": (
        lambda t: ((ROOT / "specagent/envs/store/tasks.jsonl").read_bytes(), ".jsonl"),
        lambda bad, out, t: ["run", "-c", RUN, f"env.tasks_path={bad}", f"output_dir={out}"]),
    "mcp tasks_path (jsonl)": (
        lambda t: ((ROOT / "configs/tasks/store_mcp.jsonl").read_bytes(), ".jsonl"),
        lambda bad, out, t: ["run", "-c", MCP_RUN, f"env.mcp.tasks_path={bad}", f"output_dir={out}"]),
    "mcp tasks_path (yaml)": (
        lambda t: (_tasks_yaml(ROOT / "configs/tasks/store_mcp.jsonl"), ".yaml"),
        lambda bad, out, t: ["run", "-c", MCP_RUN, f"env.mcp.tasks_path={bad}", f"output_dir={out}"]),
    "mine trajectories": (lambda t: (t.read_bytes(), ".jsonl"),
                          lambda bad, out, t: ["mine", f"trajectories={bad}", f"output_dir={out}"]),
    "train drafter dataset": (
        lambda t: (t.read_bytes(), ".jsonl"),
        lambda bad, out, t: ["train", "drafter", f"dataset={bad}", f"output_dir={out}", f"model={NO_MODEL}"]),
    "import input": (lambda t: (t.read_bytes(), ".jsonl"), lambda bad, out, t: ["import", bad, "-o", out / "t.jsonl"]),
}


@pytest.mark.parametrize("case", list(NOT_UTF8_CASES))
@FAST
@given(data=st.data())
@example(data=None)  # the first run: a single 0xff at the very start
def test_a_file_that_is_not_utf8_is_one_error_naming_file_and_line(case, data, trajectories, tmp_path_factory):
    valid, make_argv = NOT_UTF8_CASES[case]
    good, suffix = valid(trajectories)
    bad_bytes, line = (b"\xff" + good, 1) if data is None else insert_bad_bytes(good, data.draw)
    work = tmp_path_factory.mktemp("utf8")
    bad, out = work / f"bad{suffix}", work / "out"
    bad.write_bytes(bad_bytes)
    assert_refused(cli(*make_argv(bad, out, trajectories)), f"{bad}:{line}:", "not UTF-8")
    assert snapshot(out) is None


def test_the_real_command_prints_one_line_and_no_traceback(tmp_path):
    bad = tmp_path / "config.yaml"
    bad.write_bytes(RUN.read_bytes().replace(b"# Deterministic", b"# D\xe9terministic"))
    out = subprocess.run([sys.executable, "-m", "specagent", "run", "-c", str(bad), f"output_dir={tmp_path / 'o'}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and f"{bad}:1: " in out.stderr
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------- a directory where a file goes


DIRECTORY_CASES = {
    "config -c": lambda d, out, t: ["run", "-c", d, f"output_dir={out}"],
    "import -o": lambda d, out, t: ["import", t, "-o", d],
    "train drafter dataset": lambda d, out, t: ["train", "drafter", f"dataset={d}", f"output_dir={out}",
                                                f"model={NO_MODEL}"],
    "collect output": lambda d, out, t: ["collect", "-c", COLLECT, f"output={d}", "env.limit=1"],
}


@pytest.mark.parametrize("case", list(DIRECTORY_CASES))
def test_a_directory_where_a_file_is_expected(case, trajectories, tmp_path):
    directory = tmp_path / "a-directory.jsonl"
    (directory / "inside").mkdir(parents=True)
    before = snapshot(tmp_path)
    assert_refused(cli(*DIRECTORY_CASES[case](directory, tmp_path / "out", trajectories)), str(directory),
                   "directory")
    assert snapshot(tmp_path) == before


def test_import_into_a_path_below_a_file(trajectories, tmp_path):
    (tmp_path / "file").write_text("x")
    before = snapshot(tmp_path)
    assert_refused(cli("import", trajectories, "-o", tmp_path / "file" / "t.jsonl"), str(tmp_path / "file"))
    assert snapshot(tmp_path) == before


def test_a_json_line_that_holds_a_unicode_line_separator_is_one_line(tmp_path):
    """U+2028 and U+0085 are line breaks to str.splitlines but plain characters in a JSON string
    (written unescaped with ensure_ascii=False): an import, and a mine of its output, must read them."""
    record = {"messages": [{"role": "user", "content": "first\u2028second\x85third"},
                           {"role": "assistant", "content": "ok"}]}
    logs = tmp_path / "logs.jsonl"
    logs.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    code, _, err = cli("import", logs, "-o", tmp_path / "t.jsonl")
    assert code == 0, err
    # the trajectory file reads back: what stops the mine is the misspelt tool, checked after reading
    assert_refused(cli("mine", f"trajectories={tmp_path / 't.jsonl'}", f"output_dir={tmp_path / 'o'}",
                       "read_only=[nope]"), "env.read_only: unknown tool(s) 'nope'")


# --------------------------------------------------------------------- a corrupt episodes file


def _torn(line: str):
    return st.integers(1, len(line) - 1).map(lambda k: line[:k])


def _not_an_episode(text: str) -> bool:
    if not text.strip():
        return False  # a blank line is skipped, not corrupt
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return True
    return not (isinstance(value, dict) and "task_id" in value)


GARBAGE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), min_size=1,
                  max_size=40).filter(_not_an_episode)
WRONG_SHAPE = st.sampled_from(['[1, 2]', '"an episode"', '42', 'null', '{}', '{"task_id": "lookup_01"}',
                               '{"task_id": "lookup_01", "mode": "strong", "trial": "one"}'])


@pytest.mark.parametrize("command", ["run", "eval", "collect"])
@FAST
@given(data=st.data())
def test_a_corrupt_line_inside_the_episodes_file_refuses_the_resume(command, data, finished, tmp_path_factory):
    out_dir, episodes, argv = copy_of(finished[command], tmp_path_factory)
    lines = episodes.read_bytes().split(b"\n")[:-1]
    at = data.draw(st.integers(0, len(lines) - 2), label="line index")  # a good line follows it
    corrupt = data.draw(st.one_of(
        _torn(lines[at].decode()).map(str.encode), GARBAGE.map(str.encode), WRONG_SHAPE.map(str.encode),
        NOT_UTF8), label="corrupt line")
    if data.draw(st.booleans(), label="replace (else insert)"):
        lines[at] = corrupt
    else:
        lines.insert(at, corrupt)
    episodes.write_bytes(b"\n".join(lines) + b"\n")
    before = snapshot(out_dir)
    assert_refused(cli(*argv), f"{episodes}:{at + 1}:")
    assert snapshot(out_dir) == before


# --------------------------------------------------------------------- resuming with another config


CHANGES = {  # a resume may not change these: each changes what an episode computes
    "protocol.max_steps": "5", "protocol.max_draft_steps": "2", "protocol.max_tokens": "64", "mode": "stepwise",
    "env.user": "multi_turn", "verifier.max_tokens": "4", "strong.temperature": "0.5", "weak.seed": "7",
    "env.tool_timeout_s": "5", "env.write": "[calculate]",
}
NEUTRAL = {"concurrency": "2", "transcript": "true", "env.limit": "3", "trials": "2",
           "env.task_ids": "[lookup_01, lookup_02]"}


@FAST
@given(changed=st.lists(st.sampled_from(sorted(CHANGES)), min_size=1, max_size=3, unique=True),
       neutral=st.lists(st.sampled_from(sorted(NEUTRAL)), max_size=3, unique=True))
def test_resuming_a_run_with_another_config_names_every_changed_key(changed, neutral, finished, tmp_path_factory):
    out_dir, _, argv = copy_of(finished["run"], tmp_path_factory)
    before = snapshot(out_dir)
    overrides = [f"{key}={CHANGES[key]}" for key in changed] + [f"{key}={NEUTRAL[key]}" for key in neutral]
    line = assert_refused(cli(*argv, *overrides), str(out_dir / "config.yaml"), f"in {len(changed)} key(s)",
                          *(f"{key}: " for key in changed))
    assert not any(f"{key}: " in line for key in neutral)
    assert snapshot(out_dir) == before


def test_resuming_a_run_with_only_neutral_changes_runs_and_without_resume_starts_over(finished, tmp_path_factory):
    out_dir, episodes, argv = copy_of(finished["run"], tmp_path_factory)
    assert cli(*argv, "concurrency=2", "env.limit=5", "transcript=true")[0] == 0
    assert len(episodes.read_text().splitlines()) == 5
    assert_refused(cli(*argv, "protocol.max_steps=5"), "protocol.max_steps: 16 -> 5")
    assert cli(*argv, "protocol.max_steps=5", "resume=false")[0] == 0  # starting over is always allowed
    assert len(episodes.read_text().splitlines()) == 4 and "max_steps: 5" in (out_dir / "config.yaml").read_text()


def test_an_eval_may_add_arms_but_not_change_one(finished, tmp_path_factory):
    out_dir, episodes, argv = copy_of(finished["eval"], tmp_path_factory)
    arms = yaml.safe_load(EVAL.read_text())["arms"]
    more = json.dumps(arms + [{"name": "weak-again", "mode": "weak"}])
    assert cli(*argv, f"arms={more}")[0] == 0
    assert len(episodes.read_text().splitlines()) == 5  # the new arm ran; the others were kept
    before = snapshot(out_dir)
    changed = json.dumps([{**arm, "mode": "strong"} if arm["name"] == "weak" else arm for arm in arms])
    assert_refused(cli(*argv, f"arms={changed}"), 'arms[weak].mode: "weak" -> "strong"',
                   "arms[weak-again].mode")  # and the arm it drops
    assert_refused(cli(*argv, f"arms={more}", "protocol.max_draft_steps=1"), "protocol.max_draft_steps")
    assert snapshot(out_dir) == before


def test_collect_resumes_only_its_own_config(finished, tmp_path_factory):
    out_dir, _, argv = copy_of(finished["collect"], tmp_path_factory)
    before = snapshot(out_dir)
    assert_refused(cli(*argv, "protocol.max_steps=3", "strong.script=reply"), str(out_dir / "t.config.yaml"),
                   "protocol.max_steps: 16 -> 3", "strong.script")
    assert snapshot(out_dir) == before
    assert cli(*argv, "env.limit=5", "min_reward=0.5")[0] == 0  # more tasks, another filter: the same runs


def test_mine_resumes_only_its_own_config(trajectories, tmp_path):
    out = tmp_path / "mined"
    argv = ["mine", f"trajectories={trajectories}", f"output_dir={out}", "env=store", "drafter.backend=scripted"]
    assert cli(*argv, "limit=2")[0] == 0
    before = snapshot(out)
    assert_refused(cli(*argv, "window=2", "max_draft_steps=3"), str(out / "mine_config.yaml"), "window: 4 -> 2",
                   "max_draft_steps: 4 -> 3")
    assert snapshot(out) == before
    assert cli(*argv, "limit=3", "batch_trajectories=2")[0] == 0  # more trajectories, bigger batches: resumes


@pytest.mark.parametrize("kind", ["drafter", "verdict"])
def test_training_resumes_a_checkpoint_only_with_its_own_config(kind, trajectories, tmp_path):
    out = tmp_path / "train"
    dataset = str(trajectories) if kind == "drafter" else str(tmp_path / "verdict-dataset")
    (tmp_path / "verdict-dataset").mkdir()
    schema = DrafterTrainConfig if kind == "drafter" else VerdictTrainConfig
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "config.yaml").write_text(dump_config(schema(dataset=dataset, output_dir=str(out), model=NO_MODEL)))
    before = snapshot(out)
    argv = ["train", kind, f"dataset={dataset}", f"output_dir={out}", f"model={NO_MODEL}"]
    assert_refused(cli(*argv, "lora.r=4", "train.learning_rate=0.01", "train.max_steps=9"),
                   str(out / "config.yaml"), "lora.r: 16 -> 4", "train.learning_rate")
    assert snapshot(out) == before


# --------------------------------------------------------------------- everything checked before any output


CHECKED_FIRST = {  # name -> (argv writing into `out`, what the error names)
    "run: a misspelt env.read_only tool": (
        lambda out, t: ["run", "-c", RUN, f"output_dir={out}", "env.read_only=[get_usr]"], "'get_usr'"),
    "run: a drafter adapter path that is not there": (
        lambda out, t: ["run", "-c", RUN, f"output_dir={out}", f"drafter_adapter={out.parent / 'no/adapter'}"],
        "drafter_adapter"),
    "run: a verdict head that is not there": (
        lambda out, t: ["run", "-c", RUN, f"output_dir={out}", "verifier.kind=head",
                        f"verifier.head={out.parent / 'no-head'}"], "no-head"),
    "run: a head on an engine that cannot score": (
        lambda out, t: ["run", "-c", RUN, f"output_dir={out}", "verifier.kind=head",
                        f"verifier.head={head_dir(out.parent)}"], "scores prompt positions"),
    "eval: an arm's adapter that is not there": (
        lambda out, t: ["eval", "-c", EVAL, f"output_dir={out}",
                        'arms=[{name: tuned, mode: weak, drafter_adapter: /no/such/adapter}]'], "/no/such/adapter"),
    "collect: a misspelt env.write tool": (
        lambda out, t: ["collect", "-c", COLLECT, f"output={out / 't.jsonl'}", "env.limit=1",
                        "env.write=[cancel_ordr]"], "'cancel_ordr'"),
    "collect: output below a file": (
        lambda out, t: ["collect", "-c", COLLECT, f"output={out.parent / 'file' / 't.jsonl'}", "env.limit=1"],
        "a file is where"),
    "mine: a misspelt read_only tool": (
        lambda out, t: ["mine", f"trajectories={t}", f"output_dir={out}", "read_only=[get_usr]"], "'get_usr'"),
    "mine: a drafter adapter path that is not there": (
        lambda out, t: ["mine", f"trajectories={t}", f"output_dir={out}", "env=store", "drafter.backend=scripted",
                        f"drafter_adapter={out.parent / 'no/adapter'}"], "drafter_adapter"),
    "train drafter: a dataset dir that is not there": (
        lambda out, t: ["train", "drafter", f"dataset={out.parent / 'no-dataset'}", f"output_dir={out}",
                        f"model={NO_MODEL}"], "no-dataset"),
    "train verdict: a dataset dir that is not there": (
        lambda out, t: ["train", "verdict", f"dataset={out.parent / 'no-dataset'}", f"output_dir={out}",
                        f"model={NO_MODEL}"], "no-dataset"),
}


def head_dir(base: Path) -> Path:
    """A verdict head on disk (its two files; nothing loads it)."""
    head = base / "head"
    head.mkdir(exist_ok=True)
    (head / "adapter_config.json").write_text("{}")
    (head / "verdict.json").write_text('{"kind": "head"}')
    return head


@pytest.mark.parametrize("case", list(CHECKED_FIRST))
def test_a_config_problem_is_found_before_any_output_is_written(case, trajectories, tmp_path):
    make_argv, named = CHECKED_FIRST[case]
    (tmp_path / "file").write_text("x")
    out = tmp_path / "out"
    argv = make_argv(out, trajectories)
    before = snapshot(tmp_path)
    assert_refused(cli(*argv), named)
    assert snapshot(tmp_path) == before


# --------------------------------------------------------------------- regression guards


GUARDS = {  # these already failed before any output; they must keep doing so
    "an unknown task id": (lambda out, d: ["run", "-c", RUN, f"output_dir={out}", "env.task_ids=[nope]"], "'nope'"),
    "an airline data dir that is not there": (
        lambda out, d: ["run", "-c", RUN, f"output_dir={out}", "env.name=airline",
                        f"env.airline.data_dir={out.parent / 'no-data'}"], "no-data"),
    "a task file that is a directory": (
        lambda out, d: ["run", "-c", RUN, f"output_dir={out}", f"env.tasks_path={d}"], "directory"),
    "a trajectories file that is a directory": (
        lambda out, d: ["mine", f"trajectories={d}", f"output_dir={out}"], "directory"),
}


@pytest.mark.parametrize("case", list(GUARDS))
def test_errors_found_early_before_this_fix_still_are(case, tmp_path):
    make_argv, named = GUARDS[case]
    (tmp_path / "a-dir.jsonl").mkdir()
    before = snapshot(tmp_path)
    assert_refused(cli(*make_argv(tmp_path / "out", tmp_path / "a-dir.jsonl")), named)
    assert snapshot(tmp_path) == before
