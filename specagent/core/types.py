"""Value types of the protocol. OpenAI chat format is the wire format.

Everything here is plain data: no model, no environment, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Iterable, Literal

Dtype = Literal["float32", "bfloat16", "float16", "auto"]  # weight dtypes a config may ask for
Quantization = Literal["w8a8"]  # schemes `specagent export --quantize` writes (engines/quantize.py)


@dataclass(frozen=True)
class ToolCall:
    """One function call inside an assistant message. ``arguments`` is decoded JSON."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, sort_keys=True)},
        }

    @classmethod
    def from_openai(cls, raw: dict[str, Any]) -> "ToolCall":
        fn = raw["function"]
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        return cls(id=raw.get("id", ""), name=fn["name"], arguments=args)


@dataclass(frozen=True)
class Message:
    """A chat message in OpenAI format (system, user, assistant or tool)."""

    role: str
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_openai(cls, raw: dict[str, Any]) -> "Message":
        return cls(
            role=raw["role"],
            content=raw.get("content"),
            tool_calls=tuple(ToolCall.from_openai(c) for c in raw.get("tool_calls") or ()),
            tool_call_id=raw.get("tool_call_id"),
            name=raw.get("name"),
        )


@dataclass(frozen=True)
class ToolSpec:
    """A tool in OpenAI function format plus its read-only flag.

    ``read_only`` is what the environment declares (None: it says nothing). The
    protocol never reads it directly: it goes through ``classify_tools`` so that the
    user's configuration wins and unknown means write.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool | None = None

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @classmethod
    def from_openai(cls, raw: dict[str, Any], read_only: bool | None = None) -> "ToolSpec":
        fn = raw.get("function", raw)
        return cls(
            name=fn["name"],
            description=fn.get("description", ""),
            parameters=fn.get("parameters") or {"type": "object", "properties": {}},
            read_only=raw.get("read_only", read_only),
        )


class StepKind(str, Enum):
    """What executing a step would do to the world."""

    READ = "read"  # only read-only tool calls: executed while drafting
    WRITE = "write"  # at least one state-changing (or unknown) tool call: held
    REPLY = "reply"  # a message to the user: held
    MALFORMED = "malformed"  # cannot be executed at all: always repaired


class StepStatus(str, Enum):
    """The fate of a step, as the transcript shows it."""

    ACCEPTED = "accepted"  # drafted, approved by the verifier, committed
    REJECTED = "rejected"  # drafted, not approved (or after the first rejection)
    HELD_APPROVED = "held_approved"  # the held step, approved and then executed
    REPAIRED = "repaired"  # authored by the strong model in place of a rejected step
    AUTHORED = "authored"  # baselines: the acting model wrote it
    MALFORMED = "malformed"  # drafted but unparseable/invalid: never executed


@dataclass(frozen=True)
class Usage:
    """What one model call cost. ``cached_tokens`` are prompt tokens read from a prefix cache.

    ``requests`` and the bytes are set by remote engines only (0 for a local one): the HTTP
    requests the server answered for this call, retries included, and their body bytes."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass(frozen=True)
class DraftedStep:
    """A step the weak model wrote, with the observations of its calls if it was executed."""

    message: Message
    kind: StepKind
    observations: tuple[Message, ...] = ()
    malformed: str | None = None

    @property
    def held(self) -> bool:
        return self.kind in (StepKind.WRITE, StepKind.REPLY)

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.message.tool_calls)


# Draft endings at a step the drafter wrote but the draft did not keep (a lookup the replay log
# never recorded; a lookup repeated, `draft_stop_repeats`): it counts as a drafted step that is
# not accepted, and the strong model writes that step.
DROPPED_STEP = ("unrecorded", "repeat")


@dataclass(frozen=True)
class Segment:
    """What one DRAFT phase produced from the committed context of ``context_len`` messages."""

    context_len: int
    steps: tuple[DraftedStep, ...]
    ended_by: str = ""  # held | malformed | max_steps | unrecorded | unsure | repeat | context_length
    # replay mining: the tools of the drafted lookup that could not run (the log never made
    # it); it is not in `steps` (it has no observation) but counts as a drafted, rejected step
    unrecorded: tuple[str, ...] = ()
    # The step the drafter stopped writing at its first unsure token (`ChatRequest.stop_below`):
    # its text so far. Never parsed, executed or committed; a verdict that reads it (a likelihood
    # verdict) names how much of it the strong model would write, and the repair goes on from there.
    partial: str | None = None

    @property
    def dropped_step(self) -> bool:
        """The draft ended at a step the drafter wrote and the draft did not keep (`DROPPED_STEP`)."""
        return self.ended_by in DROPPED_STEP

    @property
    def verifiable(self) -> tuple[DraftedStep, ...]:
        """The steps the verifier sees: everything before the first malformed step."""
        out = []
        for step in self.steps:
            if step.kind is StepKind.MALFORMED:
                break
            out.append(step)
        return tuple(out)


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgment: the longest valid prefix of the verifiable steps."""

    accepted: int
    raw: str = ""
    scores: tuple[float, ...] = ()  # P(valid | prefix) per step, for a verdict head
    invalid: str | None = None  # why the reply is not a verdict (then nothing is accepted)
    # The first rejected step's opening that the strong model itself ranks first, token by
    # token, up to the first token it would not write (a likelihood verdict reads this in its
    # prefill): the repair continues from it instead of decoding it again. Never decoded text.
    repair_from: str = ""


@dataclass
class Trajectory:
    """One agent run in the artifact format of DESIGN §2."""

    id: str
    task_id: str
    tools: list[ToolSpec]
    messages: list[Message]
    reward: float | None = None
    source: str = ""
    model: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "specagent.trajectory/v1",
            "id": self.id,
            "task_id": self.task_id,
            "tools": [dict(t.to_openai(), read_only=t.read_only) for t in self.tools],
            "messages": [m.to_openai() for m in self.messages],
            "reward": self.reward,
            "source": self.source,
            "model": self.model,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "Trajectory":
        return cls(
            id=raw["id"],
            task_id=str(raw["task_id"]),
            tools=[ToolSpec.from_openai(t) for t in raw.get("tools", [])],
            messages=[Message.from_openai(m) for m in raw["messages"]],
            reward=raw.get("reward"),
            source=raw.get("source", ""),
            model=raw.get("model", ""),
            meta=raw.get("meta", {}),
        )


def union_tools(trajectories: "Iterable[Trajectory]") -> list[ToolSpec]:
    """Every tool of the trajectories, the first spec seen for each name; where two specs of
    a name disagree on ``read_only``, the unsafe reading wins (write over unknown over read)."""
    seen: dict[str, ToolSpec] = {}
    for trajectory in trajectories:
        for tool in trajectory.tools:
            first = seen.setdefault(tool.name, tool)
            if first.read_only is not tool.read_only:
                seen[tool.name] = replace(first, read_only=unsafe_flag(first.read_only, tool.read_only))
    return list(seen.values())


def unsafe_flag(a: bool | None, b: bool | None) -> bool | None:
    """The less safe of two read-only declarations: False (write) > None (unknown) > True."""
    if a is False or b is False:
        return False
    return None if a is None or b is None else True
