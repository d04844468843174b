"""Every shipped config validates; typos and bad values fail with every problem listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from specagent.config import (
    CollectConfig,
    DrafterTrainConfig,
    EvalConfig,
    MineConfig,
    RunConfig,
    ServeConfig,
    VerdictTrainConfig,
    load_config,
)
from specagent.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
RUN_CONFIGS = sorted((ROOT / "configs" / "run").glob("*.yaml"))
# configs/import/*.yaml are tools files, validated in tests/data/test_schemas.py
IMPORT_CONFIGS = sorted((ROOT / "configs" / "import").glob("*.yaml"))
MINE_CONFIGS = sorted((ROOT / "configs" / "mine").glob("*.yaml"))
COLLECT_CONFIGS = sorted((ROOT / "configs" / "collect").glob("*.yaml"))
# configs/train/strong: the strong expert S, trained by `specagent train drafter` (the same SFT recipe)
TRAIN_DRAFTER_CONFIGS = sorted([*(ROOT / "configs" / "train" / "drafter").glob("*.yaml"),
                                *(ROOT / "configs" / "train" / "strong").glob("*.yaml")])
TRAIN_VERDICT_CONFIGS = sorted((ROOT / "configs" / "train" / "verdict").glob("*.yaml"))
# configs/accelerate/*.yaml are accelerate's own files, loaded in tests/train/test_train_configs.py
ACCELERATE_CONFIGS = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
SERVE_CONFIGS = sorted((ROOT / "configs" / "serve").glob("*.yaml"))
EVAL_CONFIGS = sorted((ROOT / "configs" / "eval").glob("*.yaml"))
QUICKSTART = ROOT / "configs" / "quickstart" / "pipeline.yaml"
FULL = ROOT / "configs" / "quickstart" / "full.yaml"
FULL_TICKET = ROOT / "configs" / "quickstart" / "full_ticket.yaml"
MULTI_TURN = ROOT / "configs" / "quickstart" / "multi_turn.yaml"
HEAD = ROOT / "configs" / "quickstart" / "head.yaml"
HEAD_ROLLOUT = ROOT / "configs" / "quickstart" / "head_rollout.yaml"
QUICKSTART_STAGES = sorted((ROOT / "configs" / "quickstart").glob("*.yaml"))
AIRLINE = ROOT / "configs" / "airline" / "pipeline.yaml"


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_shipped_run_config_validates(path):
    cfg = load_config(RunConfig, path)
    assert cfg.mode in ("strong", "weak", "stepwise", "specagent")


@pytest.mark.parametrize("path", MINE_CONFIGS, ids=lambda p: p.name)
def test_shipped_mine_config_validates(path):
    assert load_config(MineConfig, path).labelers


@pytest.mark.parametrize("path", COLLECT_CONFIGS, ids=lambda p: p.name)
def test_shipped_collect_config_validates(path):
    assert load_config(CollectConfig, path).output.endswith(".jsonl")


@pytest.mark.parametrize("path", TRAIN_DRAFTER_CONFIGS, ids=lambda p: p.name)
def test_shipped_train_drafter_config_validates(path):
    assert load_config(DrafterTrainConfig, path).dataset


@pytest.mark.parametrize("path", TRAIN_VERDICT_CONFIGS, ids=lambda p: p.name)
def test_shipped_train_verdict_config_validates(path):
    assert load_config(VerdictTrainConfig, path).kind in ("head", "generative", "likelihood")


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_shipped_serve_config_validates(path):
    cfg = load_config(ServeConfig, path)
    assert cfg.host == "127.0.0.1" and cfg.port > 0


@pytest.mark.parametrize("path", EVAL_CONFIGS, ids=lambda p: p.name)
def test_shipped_eval_config_validates(path):
    modes = {arm.mode for arm in load_config(EvalConfig, path).arms}
    assert {"strong", "weak"} <= modes  # every eval shows the pair it speculates over


def test_quickstart_pipeline_and_every_stage_config_validate():
    from specagent.quickstart import PipelineConfig, stage_plan

    stages = load_config(PipelineConfig, QUICKSTART).stages
    plans = [stage_plan(stage, QUICKSTART.parent) for stage in stages]  # loads each stage's config
    used = {QUICKSTART.parent / s.config for s in stages if s.config} | {QUICKSTART, FULL, FULL_TICKET, MULTI_TURN, HEAD,
                                                                       HEAD_ROLLOUT}
    assert used == set(QUICKSTART_STAGES)
    assert [argv[0] for argv, _, _ in plans] == ["collect", "train", "export", "train", "export", "eval"]


def test_the_full_quickstart_is_the_multi_turn_recipe_without_its_first_drafter():
    """`specagent quickstart --full`: the stages of configs/quickstart/multi_turn.yaml that build
    the lead table's pair (S for both user modes, its drafter distilled from S's own runs, int8)
    in the same order with the same configs, then the lead table's eval of that pair; the first
    drafter (from demonstrations) and its eval are left out. The drafter is int8 and pruned to
    the tokens of its training rows."""
    from specagent.cli import FULL_PIPELINE
    from specagent.quickstart import PipelineConfig, report_paths, stage_plan

    assert ROOT / FULL_PIPELINE == FULL
    full = load_config(PipelineConfig, FULL).stages
    multi_turn = load_config(PipelineConfig, MULTI_TURN).stages
    assert full[:-1] == multi_turn[:4] + multi_turn[7:11]
    plans = [stage_plan(stage, FULL.parent) for stage in full]  # each stage's config validates
    assert [argv[0] for argv, _, _ in plans] == ["collect", "collect", "train", "export", "collect", "collect",
                                                 "train", "export", "eval"]
    assert plans[7][0][-3:] == ["--quantize", "w8a8", "--prune-vocab"]
    latency = load_config(EvalConfig, FULL.parent / full[-1].config)
    distilled = load_config(DrafterTrainConfig, FULL.parent / full[6].config)
    assert latency.concurrency == 1 and latency.env.split == "eval" and latency.env.user == "ticket"
    assert (latency.strong.model, latency.weak.model) == (distilled.model, f"{full[7].to}/model")
    assert {arm.mode for arm in latency.arms} == {"strong", "weak", "specagent"}
    assert [p.parent.name for p in report_paths(FULL)] == [Path(latency.output_dir).name]


def test_the_ticket_full_recipe_is_the_quickstart_then_its_pairs_recipe():
    """configs/quickstart/full_ticket.yaml (d85fa26's `--full`): the quickstart's stages unchanged, then S's own runs, the
    drafter distilled from them, its export, the eval of the README's lead table, and the same
    drafter quantized (export --quantize w8a8) with its eval."""
    from specagent.quickstart import PipelineConfig, report_paths, stage_plan

    quick, full = load_config(PipelineConfig, QUICKSTART).stages, load_config(PipelineConfig, FULL_TICKET).stages
    assert full[: len(quick)] == quick
    plans = [stage_plan(stage, FULL_TICKET.parent) for stage in full[len(quick):]]  # each stage's config validates
    assert [argv[:2] for argv, _, _ in plans] == [["collect", "-c"], ["train", "drafter"],
                                                  ["export", "runs/quickstart/train/drafter-on-policy"],
                                                  ["eval", "-c"],
                                                  ["export", "runs/quickstart/train/drafter-on-policy"],
                                                  ["eval", "-c"]]
    assert plans[-2][0][-2:] == ["--quantize", "w8a8"] and "--quantize" not in plans[2][0]
    trained = load_config(DrafterTrainConfig, FULL_TICKET.parent / full[len(quick) + 1].config)
    collected = load_config(CollectConfig, FULL_TICKET.parent / full[len(quick)].config)
    assert trained.dataset == collected.output  # the drafter learns from S's runs of the collect stage
    assert [p.parent.name for p in report_paths(FULL_TICKET)] == ["eval", "eval-64-latency", "eval-64-w8a8"]


def test_the_multi_turn_recipe_trains_s_and_its_drafter_on_both_collected_user_modes():
    """configs/quickstart/multi_turn.yaml: S learns from the ticket and the multi-turn
    demonstrations the pipeline collects; the drafter is cut from that S's export and learns
    from the same rows; the eval serves both exports with the multi-turn user. Then a second
    drafter of the same cut learns from S's own runs of the training tasks and is evaluated in int8."""
    from specagent.quickstart import PipelineConfig, stage_plan

    stages = load_config(PipelineConfig, MULTI_TURN).stages
    plans = [stage_plan(stage, MULTI_TURN.parent) for stage in stages]  # each stage's config validates
    assert [argv[0] for argv, _, _ in plans] == ["collect", "collect", "train", "export", "train", "export", "eval",
                                                 "collect", "collect", "train", "export", "eval"]
    collected = [load_config(CollectConfig, MULTI_TURN.parent / s.config) for s in stages[:2]]
    assert [c.env.user for c in collected] == ["ticket", "multi_turn"]
    assert collected[0].env.kinds == collected[1].env.kinds and collected[1].env.split == "train"
    strong, drafter = (load_config(DrafterTrainConfig, MULTI_TURN.parent / stages[i].config) for i in (2, 4))
    outputs = [c.output for c in collected]
    assert strong.dataset == outputs and drafter.dataset == outputs
    assert stages[3].from_ == strong.output_dir and stages[3].merge
    assert drafter.model == f"{stages[3].to}/merged" and drafter.from_layers
    assert stages[5].from_ == drafter.output_dir
    evaluated = load_config(EvalConfig, MULTI_TURN.parent / stages[6].config)
    assert evaluated.env.user == "multi_turn" and evaluated.env.split == "eval"
    assert (evaluated.strong.model, evaluated.weak.model) == (drafter.model, f"{stages[5].to}/model")
    # then S's own runs of the same tasks with both users, the drafter distilled from them, in int8
    own_runs = [load_config(CollectConfig, MULTI_TURN.parent / s.config) for s in stages[7:9]]
    assert [c.env.user for c in own_runs] == ["ticket", "multi_turn"]
    assert all(c.strong.model == drafter.model and c.env.kinds == collected[0].env.kinds for c in own_runs)
    assert {c.env.split for c in own_runs} == {"train"}
    distilled = load_config(DrafterTrainConfig, MULTI_TURN.parent / stages[9].config)
    assert distilled.dataset == [c.output for c in own_runs] and distilled.model == drafter.model
    assert distilled.from_layers == drafter.from_layers and distilled.output_dir != drafter.output_dir
    assert stages[10].from_ == distilled.output_dir and stages[10].quantize == "w8a8"
    latency = load_config(EvalConfig, MULTI_TURN.parent / stages[11].config)
    assert latency.concurrency == 1 and latency.env.split == "eval"
    assert (latency.strong.model, latency.weak.model) == (drafter.model, f"{stages[10].to}/model")


@pytest.mark.parametrize("recipe, labeler", [(HEAD, "match"), (HEAD_ROLLOUT, "rollout")], ids=["match", "rollout"])
def test_the_head_recipe_fits_on_training_drafts_calibrates_on_calibration_drafts_and_evaluates_on_eval(
        recipe, labeler):
    """configs/quickstart/head.yaml (and head_rollout.yaml): the quickstart's stages, S's runs of
    training and calibration tasks, the quickstart drafter's drafts mined at both and labeled by
    `match` (`rollout`, S continuing after each drafted prefix), the likelihood head fit on the
    first and calibrated on the second only, and the eval of held-out tasks with S and that drafter."""
    from specagent.config import MineConfig, VerdictTrainConfig
    from specagent.quickstart import PipelineConfig, stage_plan

    HEAD = recipe
    quick, stages = load_config(PipelineConfig, QUICKSTART).stages, load_config(PipelineConfig, HEAD).stages
    assert stages[: len(quick)] == quick
    rest = stages[len(quick):]
    plans = [stage_plan(stage, HEAD.parent) for stage in rest]  # each stage's config validates
    assert [argv[0] for argv, _, _ in plans] == ["collect", "collect", "mine", "mine", "train", "eval"]
    collected = [load_config(CollectConfig, HEAD.parent / s.config) for s in rest[:2]]
    mined = [load_config(MineConfig, HEAD.parent / s.config) for s in rest[2:4]]
    head = load_config(VerdictTrainConfig, HEAD.parent / rest[4].config)
    evaluated = load_config(EvalConfig, HEAD.parent / rest[5].config)
    assert [c.env.split for c in collected] == ["train", "calibration"] and evaluated.env.split == "eval"
    assert [m.trajectories for m in mined] == [c.output for c in collected]
    assert [m.env.split for m in mined] == ["train", "calibration"]
    assert [m.labelers[0] for m in mined] == [labeler, labeler]
    assert all(m.strong is None or m.strong.model == collected[0].strong.model for m in mined)
    assert mined[0].drafter.model == mined[1].drafter.model == evaluated.weak.model == f"{quick[4].to}/model"
    assert head.kind == "likelihood" and head.dataset == f"{mined[0].output_dir}/verdict"
    assert head.calibration == f"{mined[1].output_dir}/verdict"
    assert head.scorer is None and head.model == evaluated.strong.model == collected[0].strong.model
    heads = {a.verifier.head for a in evaluated.arms if a.verifier is not None and a.verifier.head}
    assert heads == {head.output_dir}
    assert plans[4][1] == Path(head.output_dir) / "head" / "likelihood_head.json"  # what marks the stage done


def test_the_airline_pipeline_imports_mines_then_trains_on_whole_runs_with_the_held_out_tasks_apart():
    """configs/airline/pipeline.yaml (issue 17): GPT-4o's runs imported, mined at one cut each
    (tasks 20-24 the validation split), the drafter trained on the training split's whole runs."""
    from specagent.quickstart import PipelineConfig, stage_plan

    pipeline = load_config(PipelineConfig, AIRLINE)
    plans = [stage_plan(stage, AIRLINE.parent) for stage in pipeline.stages]  # each stage's config validates
    assert [argv[0] for argv, _, _ in plans] == ["import", "mine", "train"] and pipeline.output_dir == "runs/airline"
    imported = pipeline.stages[0]
    assert (ROOT / imported.tools).is_file() and imported.inputs[0].startswith("../shared/data/tau-bench-airline/")
    mined = load_config(MineConfig, AIRLINE.parent / pipeline.stages[1].config)
    trained = load_config(DrafterTrainConfig, AIRLINE.parent / pipeline.stages[2].config)
    assert mined.trajectories == imported.to and trained.dataset == f"{mined.output_dir}/drafter"
    assert mined.validation_tasks == ["20", "21", "22", "23", "24"] and mined.env.name == "airline"
    assert trained.prompt_profile == "compact" and trained.max_length == mined.drafter.max_model_len == 8192


def test_every_config_file_is_covered():
    all_yaml = set((ROOT / "configs").rglob("*.yaml"))
    covered = set(RUN_CONFIGS) | set(IMPORT_CONFIGS) | set(MINE_CONFIGS) | set(COLLECT_CONFIGS)
    covered |= set(TRAIN_DRAFTER_CONFIGS) | set(TRAIN_VERDICT_CONFIGS) | set(ACCELERATE_CONFIGS)
    covered |= set(SERVE_CONFIGS) | set(EVAL_CONFIGS) | set(QUICKSTART_STAGES) | {AIRLINE}
    assert all_yaml == covered, "a config without a schema test: add it to the lists above"


def test_all_problems_reported_together():
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, None, ["mode=fast", "env.limt=3", "protocol.max_steps=0", "strong.backend=openai"])
    text = str(err.value)
    assert "4 problem(s)" in text
    for key in ("mode", "env.limt: unknown key", "protocol.max_steps", "base_url"):
        assert key in text


def test_overrides_are_yaml_typed():
    cfg = load_config(RunConfig, None, ["env.limit=3", "env.read_only=[a, b]", "strong.temperature=0.7"])
    assert cfg.env.limit == 3 and cfg.env.read_only == ["a", "b"] and cfg.strong.temperature == 0.7
