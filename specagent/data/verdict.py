"""Token-level labels for a verdict head: one label per drafted step, at the step's boundary.

The boundary of drafted step j is the `<|im_end|>` token that closes its assistant
message in the rendered verify prompt; every other position is -100 (ignored). Labels
are ints, never bools: a bool tensor would turn -100 into True.
"""

from __future__ import annotations

from typing import Any

from specagent.core.types import Message, ToolSpec
from specagent.engines.verdict_head import boundary_positions

IGNORE = -100


def token_labels(tokenizer: Any, example: dict[str, Any]) -> dict[str, list[int]]:
    """A `verdict` dataset row -> input_ids and labels (0/1 at step boundaries, -100 elsewhere)."""
    messages = [Message.from_openai(m) for m in example["messages"]]
    tools = [ToolSpec.from_openai(t) for t in example["tools"]]
    ids, positions = boundary_positions(tokenizer, messages, tools, example["step_message_indices"])
    labels = [IGNORE] * len(ids)
    for position, label in zip(positions, example["labels"]):
        labels[position] = int(label)
    return {"input_ids": ids, "labels": labels}
