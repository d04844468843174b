"""What mining writes: drafted segments (`specagent.segment/v1`, one line of a shard file per
mined trajectory) and the verdict rows built from them (the `verdict` dataset)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field

from specagent.core.types import DraftedStep, Message, StepKind, ToolSpec
from specagent.records.base import Record

SEGMENT_FORMAT = "specagent.segment/v1"


class DraftedStepRecord(Record):
    """One drafted step: the message, what kind of step it is, the observations of its lookups."""

    message: dict[str, Any]  # OpenAI chat format
    kind: Literal["read", "write", "reply", "malformed"]
    observations: list[dict[str, Any]] = Field(default_factory=list)
    malformed: Optional[str] = None

    @classmethod
    def of(cls, step: DraftedStep) -> "DraftedStepRecord":
        return cls(message=step.message.to_openai(), kind=step.kind.value,
                   observations=[o.to_openai() for o in step.observations], malformed=step.malformed)

    def step(self) -> DraftedStep:
        return DraftedStep(message=Message.from_openai(self.message), kind=StepKind(self.kind),
                           observations=tuple(Message.from_openai(o) for o in self.observations),
                           malformed=self.malformed)


class SegmentRecord(Record):
    """The drafted steps at one cut point of a strong trajectory, labeled (prefix-closed)."""

    format: Literal["specagent.segment/v1"] = SEGMENT_FORMAT
    id: str  # trajectory@cut; `…:reference` for the strong model's own steps
    trajectory_id: str
    task_id: str
    cut: int = Field(ge=0)  # the context is the trajectory's first `cut` messages
    steps: list[DraftedStepRecord]
    ended_by: str  # held | malformed | max_steps | unrecorded | context_length (| end, reference segments)
    unrecorded: list[str] = Field(default_factory=list)  # replay: the tools of the lookup the log could not answer
    labels: list[int]  # by `label_source`
    label_source: str  # match | judge | rollout | reference
    all_labels: dict[str, list[int]] = Field(default_factory=dict)
    reference: list[dict[str, Any]] = Field(default_factory=list)  # the strong continuation (window)
    strong_reward: Optional[float] = None

    def drafted(self) -> list[DraftedStep]:
        return [s.step() for s in self.steps]


class ShardRow(Record):
    """One line of a mining shard file: every segment of one trajectory, and what it cost."""

    trajectory_id: str
    segments: list[SegmentRecord]
    seconds_in_engines: float = 0.0
    wall_seconds: float = 0.0


class VerdictRow(Record):
    """A row of the `verdict` dataset: the rendered verify prompt of one segment, its labels at
    the step boundaries (head), and the prompt/completion pair (generative verdict)."""

    segment_id: str
    task_id: str
    label_source: str
    messages: list[dict[str, Any]]  # the verify prompt (context + drafted steps + review request)
    tools: list[dict[str, Any]]  # OpenAI function format
    step_message_indices: list[int]  # index of each drafted step's assistant message in `messages`
    labels: list[int]
    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]

    def chat(self) -> list[Message]:
        return [Message.from_openai(m) for m in self.messages]

    def prompt_chat(self) -> list[Message]:
        return [Message.from_openai(m) for m in self.prompt]

    def tool_specs(self) -> list[ToolSpec]:
        return [ToolSpec.from_openai(t) for t in self.tools]
