"""`ChatRequest.stop_below` on vLLM: a logits processor that ends a request where it is unsure.

A request whose sampling params carry ``extra_args={"stop_below": p, "unsure_token": t}`` is
stopped at the first position whose most likely token has a probability below ``p`` (the
model's own distribution, before temperature): the processor leaves only token ``t`` possible
there, and ``t`` is one of the request's ``stop_token_ids``, so the output ends with it and
`VLLMEngine` reads it as "unsure" and drops it. Other requests are untouched. Imported only
where vLLM is (the engine core loads this class by its module path).
"""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates


def _rule(params: SamplingParams, _prompt: list[int] | None, _output: list[int]) -> tuple[float, int] | None:
    extra = params.extra_args or {}
    below = float(extra.get("stop_below", 0.0) or 0.0)
    return (below, int(extra["unsure_token"])) if below > 0 and "unsure_token" in extra else None


class UnsureStop(LogitsProcessor):
    """Per request: where the top token's probability < ``stop_below``, force ``unsure_token``."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:  # noqa: ANN001
        self.rows: dict[int, tuple[float, int]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token greedy decoding picks

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, _rule)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        rows = list(self.rows)
        top = torch.softmax(logits[rows].float(), dim=-1).max(dim=-1).values.tolist()
        for row, p in zip(rows, top):
            below, token = self.rows[row]
            if p < below:
                logits[row] = float("-inf")
                logits[row, token] = 0.0
        return logits
