"""The one place prompts are rendered: specagent's chat template applied to messages + tools.

Engines, mining and training all call `render_prompt`, so a model is trained on exactly
the bytes it is served with (DESIGN §6). vLLM's server gets the same template file
(`--chat-template`, see `template_path`).

A fine-tuned role may be trained and served with a compact *prompt profile*: the tools as
one-line signatures (or not at all) instead of JSON schemas, and the policy replaced or
left out (fine-tuning distils it). The profile is saved next to the weights
(`prompt_profile.json` in an adapter or model dir) and the engines read it from there, so
training and serving apply the same `PromptProfile.apply` and cannot drift.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Sequence

from specagent.core.types import Message, ToolSpec

TEMPLATE_FILE = "chat_template.jinja"


def template_path() -> Path:
    """Path of the chat template file, for `vllm serve --chat-template`."""
    return Path(__file__).with_name(TEMPLATE_FILE)


@lru_cache(maxsize=1)
def load_template() -> str:
    """The text of specagent's chat template (ChatML + hermes tools)."""
    return template_path().read_text(encoding="utf-8")


def load_tokenizer(path: str) -> Any:
    """A model's tokenizer carrying specagent's chat template, and a pad token: what training
    tokenizes rows with and what an engine that renders prompts itself uses."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = load_template()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


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


PROFILE_FILE = "prompt_profile.json"
CALL_FORMAT = ('To call a tool, answer with one block per call:\n<tool_call>\n{"name": <tool-name>, '
               '"arguments": <arguments-json-object>}\n</tool_call>')


@dataclass(frozen=True)
class PromptProfile:
    """How a role's prompt shows the tools and the policy.

    ``tools``: "json" (the template's full JSON schemas), "signatures" (one line a tool,
    ``name(arg: type, ...): description``, in the system message) or "none".
    ``policy``: None keeps the conversation's system message, "" drops its text, any
    other text replaces it."""

    name: str = "full"
    tools: Literal["json", "signatures", "none"] = "json"
    policy: str | None = None

    def apply(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> tuple[list[Message], list[ToolSpec]]:
        """(messages, tools) to render: the system message rewritten, the tools kept only as JSON."""
        if self.tools == "json" and self.policy is None:
            return list(messages), list(tools)
        messages = list(messages)
        has_system = bool(messages) and messages[0].role == "system"
        text = (messages[0].content or "") if has_system else ""
        if self.policy is not None:
            text = self.policy
        if self.tools == "signatures" and tools:
            text = "\n\n".join(part for part in (text, "Tools:\n" + "\n".join(map(signature, tools)), CALL_FORMAT)
                               if part)
        system = Message(role="system", content=text)
        messages = [system, *messages[1:]] if has_system else [system, *messages]
        return messages, list(tools) if self.tools == "json" else []

    def save(self, directory: str | Path) -> None:
        Path(directory, PROFILE_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @staticmethod
    def saved_in(directory: str | Path) -> bool:
        return Path(directory, PROFILE_FILE).is_file()

    @classmethod
    def load(cls, directory: str | Path | None) -> "PromptProfile":
        """The profile saved in a model or adapter dir; the full prompt where there is none."""
        path = Path(directory, PROFILE_FILE) if directory else None
        if path is None or not path.is_file():
            return FULL
        data = json.loads(path.read_text())
        return cls(**{k: data[k] for k in ("name", "tools", "policy") if k in data})


FULL = PromptProfile()
PROFILES = {
    "full": FULL,
    "signatures": PromptProfile("signatures", tools="signatures"),  # the policy kept, tools as one-liners
    "compact": PromptProfile("compact", tools="signatures", policy=""),  # tools as one-liners, no policy
    "bare": PromptProfile("bare", tools="none", policy=""),  # neither: both distilled into the weights
}


def profile_named(name: str) -> PromptProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown prompt profile {name!r}; choose one of {', '.join(PROFILES)}")
    return PROFILES[name]


def signature(tool: ToolSpec) -> str:
    """``name(arg: type, opt?: type): description``; enums as ``a|b``."""
    properties = (tool.parameters or {}).get("properties", {})
    required = set((tool.parameters or {}).get("required", []))
    args = []
    for arg, schema in properties.items():
        kind = "|".join(json.dumps(v) for v in schema["enum"]) if "enum" in schema else _type_name(schema)
        args.append(f"{arg}{'' if arg in required else '?'}: {kind}")
    return f"{tool.name}({', '.join(args)}): {tool.description}".rstrip(": ")


def _type_name(schema: dict[str, Any]) -> str:
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list[{_type_name(schema.get('items', {}))}]"
    if kind == "object" and "properties" in schema:
        return "{" + ", ".join(f"{k}: {_type_name(v)}" for k, v in schema["properties"].items()) + "}"
    return "|".join(kind) if isinstance(kind, list) else str(kind)


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec] = (),
    add_generation_prompt: bool = True,
    profile: PromptProfile = FULL,
) -> str:
    """The prompt text for `messages` with `tools` offered, rendered by specagent's template
    under `profile`."""
    messages, tools = profile.apply(messages, tools)
    return tokenizer.apply_chat_template(
        template_messages(messages),
        chat_template=load_template(),
        tools=[t.to_openai() for t in tools] or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )
