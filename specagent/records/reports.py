"""What the eval and the export leave for people and tools to read: `report.json`
(`specagent.report/v1`) and an export's `export.json` manifest (`specagent.export/v1`)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field

from specagent.records.base import Record

REPORT_FORMAT = "specagent.report/v1"
EXPORT_FORMAT = "specagent.export/v1"


class Report(Record):
    """Every metric of DESIGN §3 per eval arm (95% intervals over tasks), and how it was made."""

    format: Literal["specagent.report/v1"] = REPORT_FORMAT
    reference: dict[str, Optional[str]]  # the arms ratios and the gap are measured against: {strong, weak}
    arms: dict[str, dict[str, Any]]  # arm -> core.metrics.summarize_group figures, roles, ratios
    notes: list[str] = Field(default_factory=list)
    plots: list[str] = Field(default_factory=list)
    config: dict[str, Any]  # the resolved EvalConfig
    versions: dict[str, Any]


class ExportManifest(Record):
    """What an export holds, where it came from, and what its smoke gate measured."""

    format: Literal["specagent.export/v1"] = EXPORT_FORMAT
    kind: str  # drafter | verdict-head | verdict-generative
    base_model: str
    base_dir: str
    source: str  # the training output it was exported from
    lora_rank: Optional[int] = None
    full_model: bool = False  # model/ (a full checkpoint) instead of adapter/
    merged: bool = False
    quantization: Optional[str] = None  # model/ quantized by `export --quantize` (e.g. w8a8)
    vocab: Optional[dict[str, Any]] = None  # `export --prune-vocab`: vocab_size, kept, rows
    prompt_profile: dict[str, Any]  # engines.render.PromptProfile, as saved beside the weights
    metrics: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, Any] = Field(default_factory=dict)
    trained_with: dict[str, Any] = Field(default_factory=dict)
    smoke: Optional[dict[str, Any]] = None  # None: the gate was skipped
