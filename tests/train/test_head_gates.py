"""Two failures of a verdict head the pipeline must not carry on with: a head calibrated on
the tasks it is then evaluated on (enforced before an eval or run starts), and a degenerate
head (accepts or rejects nearly every step at its threshold), which fails its export gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specagent.cli import main
from specagent.core.errors import ConfigError
from specagent.engines.verdict_head import HeadSpec
from specagent.export import SmokeGateFailed, export
from specagent.runtime.assembly import check_calibration


def fake_head(root: Path, calibration_tasks=(), degenerate=False) -> Path:
    """A training output holding a head's files (no weights are read by these checks)."""
    adapter = root / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    HeadSpec(threshold=0.3, base_model="smollm2", calibration_tasks=tuple(calibration_tasks),
             degenerate=degenerate).save(adapter)
    (root / "config.yaml").write_text(yaml.safe_dump({"model": "smollm2", "dataset": str(root / "none")}))
    (root / "metrics.json").write_text(json.dumps({"calibrated": {"accept_rate": 0.0, "false_reject_rate": 1.0}}))
    return root


def test_calibration_tasks_are_saved_and_refused_at_eval_time(tmp_path):
    head = fake_head(tmp_path / "head", calibration_tasks=["lookup_01", "calib-0001"])
    assert HeadSpec.load(head / "adapter").calibration_tasks == ("lookup_01", "calib-0001")
    calibrated_on = HeadSpec.load(head / "adapter").calibration_tasks
    check_calibration(head / "adapter", calibrated_on, ["single_write_01"])  # disjoint: fine
    with pytest.raises(ConfigError, match="calibrated on 1 of the tasks it would now run .lookup_01."):
        check_calibration(head / "adapter", calibrated_on, ["lookup_01", "single_write_01"])


def test_an_eval_of_a_head_on_its_calibration_tasks_stops_before_anything_is_written(tmp_path, capsys):
    head = fake_head(tmp_path / "head", calibration_tasks=["lookup_01"])
    out = tmp_path / "eval"
    arms = ("[{name: strong, mode: strong}, {name: weak, mode: weak}, "
            f"{{name: tuned, mode: specagent, verifier: {{kind: head, head: {head}}}}}]")
    code = main(["eval", "env.task_ids=[lookup_01, lookup_02]", f"arms={arms}", f"output_dir={out}"])
    assert code == 2 and "calibrated on 1 of the tasks it would now run" in capsys.readouterr().err
    assert not out.exists()


def test_a_degenerate_head_fails_its_export_gate_unless_allowed(tmp_path):
    head = fake_head(tmp_path / "head", degenerate=True)
    with pytest.raises(SmokeGateFailed, match="degenerate at its threshold 0.3 .accept rate 0.0, false-reject 1.0"):
        export(head, tmp_path / "export", smoke=False)
    assert not (tmp_path / "export").exists()
    manifest = export(head, tmp_path / "export", smoke=False, allow_degenerate=True)
    assert manifest["kind"] == "verdict-head" and (tmp_path / "export" / "adapter" / "verdict.json").is_file()
    healthy = fake_head(tmp_path / "healthy")
    assert export(healthy, tmp_path / "export2", smoke=False)["kind"] == "verdict-head"
