"""Token-level labels for a verdict head: one label per drafted step, at the step's boundary.

The boundary of drafted step j is the `<|im_end|>` token that closes its assistant
message in the rendered verify prompt; every other position is -100 (ignored). Labels
are ints, never bools: a bool tensor would turn -100 into True.
"""

from __future__ import annotations

from typing import Any, Sequence

from specagent.core.types import Message, ToolSpec
from specagent.engines.render import render_prompt

IGNORE = -100
STEP_END = "<|im_end|>"


def boundary_positions(tokenizer: Any, messages: Sequence[Message], tools: Sequence[ToolSpec],
                       step_indices: Sequence[int]) -> tuple[list[int], list[int]]:
    """(token ids of the whole verify prompt, position of each step's closing token)."""
    ids = tokenizer(render_prompt(tokenizer, messages, tools), add_special_tokens=False)["input_ids"]
    end_id = tokenizer.convert_tokens_to_ids(STEP_END)
    positions = []
    for index in step_indices:
        prefix = render_prompt(tokenizer, messages[: index + 1], tools, add_generation_prompt=False)
        n = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
        position = max(i for i in range(n) if ids[i] == end_id)
        positions.append(position)
    return ids, positions


def token_labels(tokenizer: Any, example: dict[str, Any]) -> dict[str, list[int]]:
    """A `verdict` dataset row -> input_ids and labels (0/1 at step boundaries, -100 elsewhere)."""
    messages = [Message.from_openai(m) for m in example["messages"]]
    tools = [ToolSpec.from_openai(t) for t in example["tools"]]
    ids, positions = boundary_positions(tokenizer, messages, tools, example["step_message_indices"])
    labels = [IGNORE] * len(ids)
    for position, label in zip(positions, example["labels"]):
        labels[position] = int(label)
    return {"input_ids": ids, "labels": labels}
