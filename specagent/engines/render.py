"""The one place prompts are rendered: specagent's chat template applied to messages + tools.

Engines, mining and training all call `render_prompt`, so a model is trained on exactly
the bytes it is served with (DESIGN §6). vLLM's server gets the same template file
(`--chat-template`, see `template_path`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from specagent.core.types import Message, ToolSpec

TEMPLATE_FILE = "chat_template.jinja"


def template_path() -> Path:
    """Path of the chat template file, for `vllm serve --chat-template`."""
    return Path(__file__).with_name(TEMPLATE_FILE)


@lru_cache(maxsize=1)
def load_template() -> str:
    """The text of specagent's chat template (ChatML + hermes tools)."""
    return template_path().read_text(encoding="utf-8")


def template_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as the template wants them: OpenAI dicts with tool-call arguments as dicts.

    OpenAI's wire format carries arguments as JSON strings; vLLM decodes them before
    templating, and so do we, so both render arguments byte-identically.
    """
    out = []
    for message in messages:
        raw = message.to_openai()
        for call, parsed in zip(raw.get("tool_calls", ()), message.tool_calls):
            call["function"]["arguments"] = dict(parsed.arguments)
        out.append(raw)
    return out


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec] = (),
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for `messages` with `tools` offered, rendered by specagent's template."""
    return tokenizer.apply_chat_template(
        template_messages(messages),
        chat_template=load_template(),
        tools=[t.to_openai() for t in tools] or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )
