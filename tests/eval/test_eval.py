"""`specagent eval`: a matrix of arms on store tasks with scripted models; the report's numbers
checked against values computed by hand from the episodes; resume; shared engines."""

from __future__ import annotations

import json
import math
import re

import pytest

import specagent.engines
from specagent.cli import main
from specagent.config import ArmConfig, EvalConfig, TransformersEngineConfig, VerifierConfig, load_config
from specagent.core.accounting import Ledger
from specagent.core.canonical import same_step
from specagent.core.errors import ConfigError
from specagent.core.metrics import bootstrap_ratio, ratio_ci
from specagent.core.protocol import Models, ProtocolConfig
from specagent.core.types import Message
from specagent.engines.scripted import ScriptedEngine, ScriptedVerifier
from specagent.envs.store import StoreEnv
from specagent.envs.store.expert import expert_policy, expert_steps
from specagent.eval.arms import expand_arms, with_shared_adapters
from specagent.eval.report import COLUMNS, write_report
from specagent.runtime.assembly import write_run_info
from specagent.runtime.episodes import read_episodes, run_tasks

TASKS = ["lookup_01", "lookup_02", "lookup_03", "lookup_04"]
WEAK_FAILS = {"lookup_03", "lookup_04"}  # the weak model only apologises on these
SORRY = "Sorry, I cannot help with that."
PLOTS = ("acceptance_by_position.png", "acceptance_by_tool.png", "cost_quality.png")
CONFIG = "configs/eval/store_scripted.yaml"


def _task_of(env, messages):
    request = next(m.content for m in messages if m.role == "user")
    return next(t for t in env.task_ids() if env.task(t)["request"] == request)


def weak_policy(env):
    """The expert, except on WEAK_FAILS, where every step is an apology (a held reply)."""
    expert = expert_policy(env)
    return lambda messages, tools: (Message("assistant", SORRY) if _task_of(env, messages) in WEAK_FAILS
                                    else expert(messages, tools))


def oracle(env):
    """Accepts the longest drafted prefix that matches the expert's next steps."""
    def judge(context, steps):
        done = sum(m.role == "assistant" for m in context)
        expected = expert_steps(env, _task_of(env, context))[done:]
        return next((i for i, (s, e) in enumerate(zip(steps, expected)) if not same_step(s.message, e)),
                    min(len(steps), len(expected)))
    return ScriptedVerifier(judge)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Every mode plus a head arm swept over two thresholds (faked: low accepts like the
    oracle, high rejects everything), run as `specagent eval` runs them; then the report."""
    out = tmp_path_factory.mktemp("eval")
    env = StoreEnv()
    strong, weak = ScriptedEngine(expert_policy(env), "strong-expert"), ScriptedEngine(weak_policy(env), "weak-sorry")
    head = VerifierConfig(kind="head", head="fake/verdict")
    cfg = EvalConfig(output_dir=str(out), env={"task_ids": TASKS}, arms=[
        *EvalConfig().arms, ArmConfig(name="head", mode="specagent", verifier=head, threshold_sweep=[0.2, 0.8])])
    models = {"strong": Models(strong=strong), "weak": Models(weak=weak), "stepwise": Models(strong, weak),
              "specagent": Models(strong, weak, oracle(env)), "head@0.2": Models(strong, weak, oracle(env)),
              "head@0.8": Models(strong, weak, ScriptedVerifier(lambda context, steps: 0))}
    write_run_info(out, cfg)
    for run in expand_arms(cfg.arms):
        names = {r: getattr(models[run.label], r).model_name for r in ("strong", "weak")
                 if getattr(models[run.label], r) is not None}
        run_tasks(env, TASKS, [run.arm.mode], models[run.label], ProtocolConfig(), out / "episodes.jsonl",
                  model_names=names, arm=run.label)
    return out, write_report(out), read_episodes(out / "episodes.jsonl")


def _strong_decode(records, arm):
    return {r["task_id"]: Ledger.from_json(r["ledger"]).total("strong").decode_tokens
            for r in records if r["arm"] == arm}


def test_one_episode_per_task_and_arm_with_the_arm_and_mode(matrix):
    _, report, records = matrix
    assert sorted((r["arm"], r["mode"]) for r in records if r["task_id"] == "lookup_01") == [
        ("head@0.2", "specagent"), ("head@0.8", "specagent"), ("specagent", "specagent"),
        ("stepwise", "stepwise"), ("strong", "strong"), ("weak", "weak")]
    assert len(records) == len(TASKS) * 6
    assert list(report["arms"]) == ["strong", "weak", "stepwise", "specagent", "head@0.2", "head@0.8"]


def test_reference_arms_success_and_gap(matrix):
    arms = matrix[1]["arms"]
    assert arms["strong"]["strong_decode_ratio"] == 1.0 and arms["strong"]["memory_traffic_ratio"] == 1.0
    assert arms["weak"]["strong_decode_tokens"] == 0 and arms["weak"]["strong_decode_ratio"] == 0.0
    weak = arms["weak"]["success"]  # per task 1, 1, 0, 0: Wilson score interval of 2 of 4
    assert weak["mean"] == 0.5 and weak["lo"] == pytest.approx(0.1500, abs=1e-4)
    assert weak["hi"] == pytest.approx(0.8500, abs=1e-4)
    assert arms["strong"]["gap_recovered"] == 1.0 and arms["weak"]["gap_recovered"] == 0.0
    assert arms["specagent"]["success"]["mean"] == 1.0 and arms["specagent"]["gap_recovered"] == 1.0
    assert arms["specagent"]["roles"] == {"strong": "strong-expert", "weak": "weak-sorry", "own_weak": False,
                                          "drafter_adapter": None, "verifier": {"kind": "generative"},
                                          "drafting": None}


def test_specagent_counts_match_the_episodes(matrix):
    """Tasks 1-2: one round, 3 drafted steps (2 lookups + the held reply), all accepted.
    Tasks 3-4: three rounds of one rejected apology, each repaired by the strong model."""
    _, report, records = matrix
    spec = report["arms"]["specagent"]
    assert (spec["drafted_steps"], spec["accepted_steps"], spec["held_approved"], spec["repairs"]) == (12, 6, 2, 6)
    assert spec["acceptance_rate"] == 0.5 and spec["mean_accepted_prefix"] == 6 / 8
    assert spec["by_position"] == {"1": {"drafted": 8, "accepted": 2, "rate": 0.25},
                                   "2": {"drafted": 2, "accepted": 2, "rate": 1.0},
                                   "3": {"drafted": 2, "accepted": 2, "rate": 1.0}}
    assert spec["per_tool"]["reply"] == {"drafted": 8, "accepted": 2, "rate": 0.25}
    strong, mine = _strong_decode(records, "strong"), _strong_decode(records, "specagent")
    # one verdict token per round (8 rounds) plus the repairs, which are the strong run's steps
    assert sum(mine.values()) == 8 + strong["lookup_03"] + strong["lookup_04"]
    assert spec["strong_decode_ratio"] == pytest.approx(sum(mine.values()) / sum(strong.values()))
    assert spec["tokens"]["strong"]["verdict"]["decode"] == 8
    stepwise = report["arms"]["stepwise"]
    assert stepwise["by_position"] == {"1": {"drafted": 12, "accepted": 6, "rate": 0.5}}


def test_threshold_sweep_runs_one_arm_per_threshold(matrix):
    arms = matrix[1]["arms"]
    low, high = arms["head@0.2"], arms["head@0.8"]
    assert (low["arm"], low["threshold"], high["threshold"]) == ("head", 0.2, 0.8)
    assert high["roles"]["verifier"]["threshold"] == 0.8 and high["roles"]["verifier"]["head"] == "fake/verdict"
    assert low["acceptance_rate"] == 0.5 and high["acceptance_rate"] == 0.0
    assert high["success"]["mean"] == 1.0 and high["strong_decode_ratio"] > low["strong_decode_ratio"]


def test_report_files(matrix):
    out, report, _ = matrix
    assert json.loads((out / "report.json").read_text())["arms"]["weak"]["strong_decode_tokens"] == 0
    assert report["versions"]["python"] and report["config"]["arms"][4]["threshold_sweep"] == [0.2, 0.8]
    md = (out / "report.md").read_text()
    assert "| " + " | ".join(COLUMNS) + " |" in md
    assert "| weak | 0.50 [0.15, 0.85] | 0.00 |" in md
    assert "`strong-expert`" in md and "`weak-sorry`" in md and "verdict head `fake/verdict` at threshold 0.8" in md
    for name in PLOTS:
        assert f"]({name})" in md
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_eval_resumes_without_rerunning_and_builds_one_engine(tmp_path, monkeypatch):
    built = []
    build = specagent.engines.build_engine
    monkeypatch.setattr(specagent.engines, "build_engine", lambda *a, **k: built.append(a[0]) or build(*a, **k))
    episodes = tmp_path / "episodes.jsonl"
    assert main(["eval", "-c", CONFIG, f"output_dir={tmp_path}", "env.limit=2"]) == 0
    first = episodes.read_text().splitlines()
    assert len(first) == 2 * 4 and len(built) == 1  # strong and weak have the same settings: one engine
    assert main(["eval", "-c", CONFIG, f"output_dir={tmp_path}", "env.limit=3"]) == 0
    lines = episodes.read_text().splitlines()
    assert lines[:8] == first and len(lines) == 3 * 4  # the finished episodes were not rerun
    episodes.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # killed mid-write
    assert main(["eval", "-c", CONFIG, f"output_dir={tmp_path}", "env.limit=3"]) == 0
    again = episodes.read_text().splitlines()
    assert again[:-1] == lines[:-1] and json.loads(again[-1])["arm"] == json.loads(lines[-1])["arm"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert {arm: s["episodes"] for arm, s in report["arms"].items()} == {
        "strong": 3, "weak": 3, "stepwise": 3, "specagent": 3}
    (tmp_path / "report.json").unlink()
    assert main(["report", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["arms"] == report["arms"]


def test_an_arm_with_its_own_weak_model_drafts_with_it_and_engines_are_built_once(tmp_path, monkeypatch):
    """W for the `weak` arm, and an arm whose own weak model (e.g. a drafter cut from S) is
    another engine config: each distinct engine once, each arm with its model, the report says so."""
    built = []
    build = specagent.engines.build_engine
    monkeypatch.setattr(specagent.engines, "build_engine", lambda *a, **k: built.append(a[0]) or build(*a, **k))
    arms = ("arms=[{name: strong, mode: strong}, {name: weak, mode: weak}, "
            "{name: drafter, mode: weak, weak: {backend: scripted, script: expert}}]")
    assert main(["eval", "-c", CONFIG, f"output_dir={tmp_path}", "env.limit=3", "weak.script=reply", arms]) == 0
    assert sorted(cfg.script for cfg in built) == ["expert", "reply"]  # the drafter shares the strong expert's engine
    models = {(r["arm"], r["models"]["weak"]) for r in read_episodes(tmp_path / "episodes.jsonl") if r["arm"] != "strong"}
    assert models == {("weak", "scripted-reply"), ("drafter", "scripted-expert")}
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["arms"]["drafter"]["roles"]["weak"] == "scripted-expert"
    assert report["arms"]["weak"]["roles"]["weak"] == "scripted-reply"
    assert "- `drafter`: its own weak model `scripted-expert`" in (tmp_path / "report.md").read_text()


def test_an_arms_drafting_settings_reach_its_episodes_and_no_other_arms(tmp_path, monkeypatch):
    """`drafting:` gives one specagent arm its own draft length and stop rule; the eval's
    protocol stays for the others (the expert drafts whole tasks: 4 steps, then 1 a round)."""
    from specagent.core import draft as drafting_module

    asked = []
    draft_batch = drafting_module.draft_batch
    monkeypatch.setattr("specagent.core.protocol.draft_batch",
                        lambda *a, **k: asked.append((a[0].model_name, a[-1])) or draft_batch(*a, **k))
    arms = ("arms=[{name: four, mode: specagent}, "
            "{name: one, mode: specagent, drafting: {max_draft_steps: 1, draft_stop_below: 0.25}}]")
    assert main(["eval", "-c", CONFIG, f"output_dir={tmp_path}", "env.limit=2", "weak.script=expert", arms]) == 0
    assert {below for _, below in asked} == {0.0, 0.25}
    drafted = {}
    for r in read_episodes(tmp_path / "episodes.jsonl"):
        drafted.setdefault(r["arm"], []).append(r["counts"]["drafted_steps"] / r["counts"]["rounds"])
    assert max(drafted["one"]) == 1.0 < max(drafted["four"])


def test_each_arm_starts_from_empty_prefix_caches(tmp_path, monkeypatch):
    """An arm must not reuse the prefill of the arms before it (the strong arm's runs would be
    in a later arm's cache): engines that keep a prefix cache are reset before every arm."""
    events = []
    build = specagent.engines.build_engine

    def with_a_cache(*args, **kwargs):
        engine = build(*args, **kwargs)
        engine.reset_prefix_cache = lambda: events.append("reset")
        chat = engine.chat
        engine.chat = lambda requests: events.append("chat") or chat(requests)
        return engine

    monkeypatch.setattr(specagent.engines, "build_engine", with_a_cache)
    assert main(["eval", "-c", CONFIG, f"output_dir={tmp_path}", "env.limit=1"]) == 0
    arms = "".join("R" if e == "reset" else "c" for e in events).split("R")
    assert arms[0] == "" and len(arms) == 1 + 4 and all(arms[1:])  # a reset, then that arm's calls; 4 arms


def test_report_of_a_dir_without_eval_config_is_a_clean_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "output_dir of a `specagent eval`" in capsys.readouterr().err


def _adapter(path, *files):
    path.mkdir(parents=True)
    for name in ("adapter_config.json", *files):
        (path / name).write_text("{}")
    return str(path)


def test_adapters_of_all_arms_go_on_the_shared_engines(tmp_path):
    a, b, v = _adapter(tmp_path / "a"), _adapter(tmp_path / "b" / "adapter"), _adapter(tmp_path / "v")
    head = _adapter(tmp_path / "head" / "adapter", "verdict.json")
    cfg = EvalConfig(weak=TransformersEngineConfig(adapters={"mine": a}), arms=[
        ArmConfig(name="a", mode="specagent", drafter_adapter="mine"),
        ArmConfig(name="b", mode="weak", drafter_adapter=str(tmp_path / "b")),  # an export dir: its adapter/
        ArmConfig(name="c", mode="stepwise", drafter_adapter=b),
        ArmConfig(name="d", mode="specagent", verifier=VerifierConfig(adapter=v)),
        ArmConfig(name="e", mode="specagent", verifier=VerifierConfig(kind="head", head=str(tmp_path / "head")))])
    shared = with_shared_adapters(cfg)
    assert shared.weak.adapters == {"mine": a, "b-drafter": b}
    assert shared.strong.adapters == {"d-verdict": v, "verdict-head": head}
    assert [arm.drafter_adapter for arm in shared.arms] == ["mine", "b-drafter", "b-drafter", None, None]
    assert shared.arms[3].verifier.adapter == "d-verdict"
    with pytest.raises(ConfigError, match=r"arms.0.drafter_adapter: 'nowhere' is neither an adapter name"):
        with_shared_adapters(EvalConfig(arms=[ArmConfig(name="x", mode="weak", drafter_adapter="nowhere")]))


@pytest.mark.parametrize("arms, problem", [
    ([{"name": "x", "mode": "weak"}, {"name": "x", "mode": "strong"}], "repeated: x"),
    ([{"name": "x", "mode": "specagent", "threshold_sweep": [0.5]}], "needs a head or likelihood verifier"),
    ([{"name": "x", "mode": "specagent", "verifier": {"kind": "head", "head": "h"}, "threshold_sweep": [0.5, 1.5]}],
     "in (0, 1]"),
    ([{"name": "x@1", "mode": "weak"}], "reserved"),
    ([{"name": "x", "mode": "strong", "drafter_adapter": "d"}], "has no drafter"),
    ([{"name": "x", "mode": "weak", "drafting": {"max_draft_steps": 2}}], "only mode 'specagent' drafts"),
    ([{"name": "x", "mode": "specagent", "drafting": {"draft_stop_below": 1.0}}], "draft_stop_below"),
])
def test_bad_arms_are_config_errors(arms, problem, tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text(json.dumps({"arms": arms}))
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(EvalConfig, path)


def test_bootstrap_ratio_resamples_runs_not_steps():
    """Runs resampled whole: one run with every step holds the interval's ends at its extremes."""
    assert bootstrap_ratio([2, 2, 2], [4, 4, 4]) == [0.5, 0.5]  # identical runs: no spread
    lo, hi = bootstrap_ratio([0, 0, 9, 1], [10, 10, 10, 10])
    assert 0 <= lo < 10 / 40 < hi <= 0.9
    assert bootstrap_ratio([0, 5], [10, 10], seed=1) == bootstrap_ratio([0, 5], [10, 10], seed=1)
    assert bootstrap_ratio([1], [0]) is None and bootstrap_ratio([], []) is None
    with pytest.raises(ValueError):
        bootstrap_ratio([1, 2], [3])


def test_ratio_ci_is_the_ratio_of_sums_with_a_delta_method_interval():
    ci = ratio_ci([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])  # residuals -1, 0, 1: variance 1
    half = 1.96 * math.sqrt(1 / 3) / 2
    assert ci == {"mean": 1.0, "lo": pytest.approx(1 - half), "hi": pytest.approx(1 + half), "n": 3}
    assert ratio_ci([1.0], [0.0])["mean"] is None


@pytest.mark.parametrize("solved,n,lo,hi", [(0, 36, 0.0, 0.0964), (2, 36, 0.0154, 0.1814), (36, 36, 0.9036, 1.0),
                                            (38, 106, 0.2736, 0.4533)])
def test_success_interval_is_a_wilson_interval_inside_0_1(solved, n, lo, hi):
    """0 of 36 solved is not certain failure, and 2 of 36 cannot be below 0 (the normal
    approximation gave [0, 0] and [-0.02, 0.13]); reference values: Wilson score, z = 1.96."""
    from specagent.core.metrics import rate_ci

    ci = rate_ci([1.0] * solved + [0.0] * (n - solved))
    assert ci["mean"] == pytest.approx(solved / n)
    assert ci["lo"] == pytest.approx(lo, abs=1e-4) and ci["hi"] == pytest.approx(hi, abs=1e-4)
    assert 0.0 <= ci["lo"] <= ci["mean"] <= ci["hi"] <= 1.0


def test_every_arm_has_its_own_colour_in_the_plots_even_two_of_one_mode():
    from specagent.eval.plots import _colors

    arms = {"strong": {"mode": "strong"}, "weak": {"mode": "weak"}, "drafter": {"mode": "weak"},
            "specagent": {"mode": "specagent"}, "strong-2": {"mode": "strong"}}
    colors = _colors({"arms": arms})
    assert (colors["strong"], colors["weak"]) == ("black", "0.5")
    assert len(set(colors.values())) == len(arms)


def test_the_roles_line_names_the_evals_weak_model_whatever_the_order_of_the_arms():
    from specagent.eval.report import role_lines

    def roles(weak, own):
        return {"roles": {"strong": "S", "weak": weak, "own_weak": own, "drafter_adapter": None, "verifier": None}}

    report = {"arms": {"strong": {"roles": {"strong": "S", "weak": None, "own_weak": False, "drafter_adapter": None,
                                            "verifier": None}},
                       "drafter": roles("D", True), "weak": roles("W", False)}}
    lines = role_lines(report)
    assert lines[0].endswith("weak model (drafts; acts in `weak`) = `W`")
    assert "- `drafter`: its own weak model `D`" in lines and not any(line.startswith("- `weak`") for line in lines)


def test_the_roles_lines_tell_a_likelihood_head_from_the_greedy_rule():
    from specagent.eval.report import role_lines

    def arm(verifier):
        return {"roles": {"strong": "S", "weak": "D", "own_weak": False, "drafter_adapter": None, "verifier": verifier}}

    lines = role_lines({"arms": {
        "rule": arm({"kind": "likelihood", "threshold": None, "head": None}),
        "head": arm({"kind": "likelihood", "threshold": None, "head": "runs/h"}),
        "head@0.5": arm({"kind": "likelihood", "threshold": 0.5, "head": "runs/h"})}})
    text = "\n".join(lines)
    assert "- `rule`: likelihood verdict (the strong model's own token probabilities): greedy steps only" in lines
    assert "`head`: likelihood head `runs/h` over the strong model's own token probabilities, at threshold calibrated" in text
    assert "`head@0.5`: likelihood head `runs/h` over the strong model's own token probabilities, at threshold 0.5" in text
