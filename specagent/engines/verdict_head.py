"""A trained verdict head, served by any engine that can score prompt positions.

The head is a LoRA adapter on the strong model (`specagent train verdict`, kind `head`).
At the `<|im_end|>` that closes each drafted step in the rendered verify prompt, the
adapter's next-token logits of two chosen tokens give

    P(valid | prefix) = sigmoid(logit[yes] - logit[no])

so one prefill scores every step and nothing is decoded. The verdict is the longest
prefix whose steps all score at or above the threshold (calibrated on validation data
at training time). Because the head is a plain LoRA adapter on the causal LM, the
engine that repairs steps serves it too: transformers reads the two logits directly,
vLLM reads them from `prompt_logprobs` (see `VLLMEngine.score`).

Training (`specagent.train.verdict`), the export gate and serving use the same
functions here, so the positions read are the positions trained.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from specagent.core.errors import ConfigError, EngineError
from specagent.core.interfaces import ScoreRequest, TokenScorer
from specagent.core.types import DraftedStep, Message, Segment, ToolSpec, Usage, Verdict
from specagent.core.verify import verify_messages
from specagent.engines.models import find_adapter
from specagent.engines.render import FULL, PromptProfile, render_prompt

HEAD_FILE = "verdict.json"
DEFAULT_THRESHOLD = 0.5  # P(valid) a step needs when no calibrated threshold is known


@dataclass(frozen=True)
class HeadSpec:
    """What a head reads (`verdict.json` next to its adapter)."""

    yes: str = "yes"
    no: str = "no"
    boundary: str = "<|im_end|>"
    threshold: float = DEFAULT_THRESHOLD
    base_model: str | None = None
    kind: str = "head"
    # the tasks whose verdict rows set the threshold: an eval on any of them would measure a
    # threshold chosen on its own answers (runtime.assembly refuses it)
    calibration_tasks: tuple[str, ...] = ()
    degenerate: bool = False  # at its threshold it accepts (or rejects) nearly every step

    def token_ids(self, tokenizer: Any) -> tuple[int, int]:
        ids = []
        for word in (self.yes, self.no):
            pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
            if len(pieces) != 1:
                raise ConfigError(f"verdict head token {word!r} is {len(pieces)} tokens in this tokenizer; "
                                  "it must be exactly one")
            ids.append(pieces[0])
        return ids[0], ids[1]

    def save(self, adapter_dir: str | Path, **extra: Any) -> None:
        (Path(adapter_dir) / HEAD_FILE).write_text(json.dumps({**asdict(self), **extra}, indent=2))

    @classmethod
    def load(cls, adapter_dir: str | Path) -> "HeadSpec":
        data = json.loads((Path(adapter_dir) / HEAD_FILE).read_text())
        if data.get("kind", "head") != "head":
            raise ConfigError(f"{adapter_dir}: a {data.get('kind')!r} verdict adapter, not a head")
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if "calibration_tasks" in fields:
            fields["calibration_tasks"] = tuple(str(t) for t in fields["calibration_tasks"])
        return cls(**fields)


def accepted_prefix(scores: Sequence[float], threshold: float) -> int:
    """The verdict of a head: the longest prefix whose every step scores >= threshold.

    Written so that anything that is not a comparable number rejects: a NaN score or a NaN
    threshold compares False, so ``not score >= threshold`` ends the prefix there."""
    n = 0
    for score in scores:
        if not score >= threshold:
            break
        n += 1
    return n


def head_adapter_dir(path: str | Path) -> Path:
    """The adapter dir of a head: the dir itself, or its `adapter/` (training outputs, exports)."""
    found = find_adapter(path, HEAD_FILE)
    if found is not None:
        return found
    raise ConfigError(f"{path}: no verdict head here (expected {HEAD_FILE} and adapter_config.json, "
                      "from `specagent train verdict` with kind head or `specagent export`)")


def step_message_indices(context_len: int, steps: Sequence[DraftedStep]) -> list[int]:
    """Index of each drafted step's assistant message in `verify_messages(context, steps)`."""
    out, index = [], context_len
    for step in steps:
        out.append(index)
        index += 1 + max(len(step.observations), len(step.message.tool_calls))
    return out


def boundary_positions(tokenizer: Any, messages: Sequence[Message], tools: Sequence[ToolSpec],
                       step_indices: Sequence[int], boundary: str = "<|im_end|>",
                       profile: PromptProfile = FULL) -> tuple[list[int], list[int]]:
    """(token ids of the whole verify prompt, position of the token closing each step)."""
    ids = tokenizer(render_prompt(tokenizer, messages, tools, profile=profile), add_special_tokens=False)["input_ids"]
    end_id = tokenizer.convert_tokens_to_ids(boundary)
    positions = []
    for index in step_indices:
        prefix = render_prompt(tokenizer, messages[: index + 1], tools, add_generation_prompt=False, profile=profile)
        n = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
        positions.append(max(i for i in range(n) if ids[i] == end_id))
    return ids, positions


def is_logprob(x: Any) -> bool:
    """A number an engine may report as a log-probability: <= 0 or -inf (not NaN, +inf, a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x <= 0.0


def trusted(entry: Any) -> bool:
    """A boundary's report is two log-probabilities, yes then no."""
    return (isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) == 2
            and all(map(is_logprob, entry)))


def probability(logprob_yes: float, logprob_no: float) -> float:
    """sigmoid(logit[yes] - logit[no]); the softmax normaliser cancels in the difference.
    Written not to overflow: exp is only taken of a difference <= 0."""
    d = logprob_no - logprob_yes
    if d > 0:
        e = math.exp(-d)
        return e / (1.0 + e)
    return 1.0 / (1.0 + math.exp(d))


class HeadVerifier:
    """Verdicts from a trained head on the strong engine: one prefill, zero decoded tokens."""

    def __init__(self, engine: TokenScorer, head: str | Path, threshold: float | None = None,
                 adapter: str | None = None, merged: bool = False) -> None:
        """``adapter``: the name the head's LoRA is registered under (default: its dir);
        ``merged``: the engine's base weights are the head (no adapter)."""
        self.engine = engine
        self.adapter_dir = head_adapter_dir(head)
        self.spec = HeadSpec.load(self.adapter_dir)
        self.threshold = self.spec.threshold if threshold is None else threshold
        self.adapter = None if merged else adapter or str(self.adapter_dir)
        self.candidates = self.spec.token_ids(engine.tokenizer)

    def probabilities(self, context: Sequence[Message], tools: Sequence[ToolSpec],
                      steps: Sequence[DraftedStep]) -> tuple[list[float], Usage, int]:
        messages = verify_messages(context, steps)
        profile = self.engine.profile_for(self.adapter)
        ids, positions = boundary_positions(self.engine.tokenizer, messages, tools,
                                            step_message_indices(len(context), steps), self.spec.boundary, profile)
        scores = self.engine.score([ScoreRequest(ids, positions, self.candidates, self.adapter)])[0]
        if len(scores.logprobs) != len(positions) or not all(trusted(entry) for entry in scores.logprobs):
            # an invalid verdict (everything rejected), never a verdict on steps nobody scored
            raise EngineError(f"verdict head: the engine's report of {len(positions)} boundaries is not "
                              f"[logprob yes, logprob no] per boundary: {scores.logprobs!r:.200}")
        return [probability(y, n) for y, n in scores.logprobs], scores.usage, scores.estimated

    def verify(self, context: Sequence[Message], tools: Sequence[ToolSpec], segment: Segment
               ) -> tuple[Verdict, list[tuple[str, Usage]]]:
        steps = segment.verifiable
        if not steps:
            return Verdict(accepted=0, raw="(nothing to verify)"), []
        probs, usage, estimated = self.probabilities(context, tools, steps)
        raw = "head " + " ".join(f"{p:.3f}" for p in probs) + (f" ({estimated} log-probs estimated)" if estimated else "")
        return Verdict(accepted=accepted_prefix(probs, self.threshold), raw=raw, scores=tuple(probs)), [("strong", usage)]
