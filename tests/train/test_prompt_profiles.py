"""Prompt profiles: a row rendered for training equals the prompt the engine serves, token for
token, for every profile; the profile travels with the adapter (training output, export) and
the engines apply it without being told."""

from __future__ import annotations

import json

import pytest

from specagent.core.interfaces import ChatRequest
from specagent.core.types import Message, ToolSpec
from specagent.engines.render import FULL, PROFILES, PromptProfile, render_prompt, signature
from tests.helpers.training import drafter_cfg

pytest.importorskip("trl")


@pytest.mark.parametrize("name", list(PROFILES))
def test_a_training_row_is_the_served_prompt_token_for_token(name, mined, tokenizer, tiny_causal_lm, tmp_path):
    from datasets import load_from_disk

    from specagent.engines.transformers_engine import TransformersEngine
    from specagent.train.drafter import drafter_trainer

    trainer = drafter_trainer(drafter_cfg(mined, tmp_path, "max_length=8192", f"prompt_profile={name}"),
                              tiny_causal_lm, tokenizer)
    assert trainer.prompt_profile == PROFILES[name]
    raw = load_from_disk(str(mined / "drafter"))["train"][0]
    messages = [Message.from_openai(m) for m in raw["messages"]]
    tools = [ToolSpec.from_openai(t) for t in raw["tools"]]
    engine = TransformersEngine.from_model(tiny_causal_lm, tokenizer, max_model_len=8192)
    engine.profiles[None] = PROFILES[name]  # as if read from the model dir
    row = trainer.train_dataset[0]["input_ids"]
    for cut in [i for i, m in enumerate(messages) if m.role == "assistant"]:
        served = engine._prompt_ids(ChatRequest(messages[:cut], tools, max_tokens=8))
        assert row[: len(served)] == served  # every served prompt is a prefix of the trained sequence
    whole = tokenizer(render_prompt(tokenizer, messages, tools, False, PROFILES[name]), add_special_tokens=False)
    assert row == whole["input_ids"]


def test_profiles_shorten_the_prompt_as_documented(tokenizer):
    from specagent.envs.store import StoreEnv

    env = StoreEnv()
    opening = env.reset(env.task_ids()[0])
    tools = env.tool_specs()
    sizes = {name: len(tokenizer(render_prompt(tokenizer, opening, tools, profile=p))["input_ids"])
             for name, p in PROFILES.items()}
    assert sizes["full"] > sizes["signatures"] > sizes["compact"] > sizes["bare"]
    compact = render_prompt(tokenizer, opening, tools, profile=PROFILES["compact"])
    assert signature(tools[0]) in compact and '"parameters"' not in compact and "customer service" not in compact
    bare = render_prompt(tokenizer, opening, tools, profile=PROFILES["bare"])
    assert "find_user_id_by_email" not in bare and opening[1].content in bare


def test_signatures_show_required_optional_and_enums():
    tool = ToolSpec("cancel", "Cancel an order.", {"type": "object", "properties": {
        "order_id": {"type": "string"}, "reason": {"type": "string", "enum": ["a", "b"]},
        "items": {"type": "array", "items": {"type": "string"}}}, "required": ["order_id", "reason"]})
    assert signature(tool) == 'cancel(order_id: string, reason: "a"|"b", items?: list[string]): Cancel an order.'


def test_the_profile_travels_with_the_adapter_and_the_engines_read_it(mined, tokenizer, tiny_causal_lm, tmp_path):
    from specagent.engines.transformers_engine import TransformersEngine
    from specagent.train.drafter import train_drafter

    cfg = drafter_cfg(mined, tmp_path, "train.max_steps=1", "max_length=4096", "prompt_profile=compact")
    train_drafter(cfg, tiny_causal_lm, tokenizer)
    out = tmp_path / "out"
    saved = json.loads((out / "adapter" / "prompt_profile.json").read_text())
    assert saved["name"] == "compact" and PromptProfile.load(out) == PROFILES["compact"]
    engine = TransformersEngine.from_model(tiny_causal_lm, tokenizer, adapters={"drafter": str(out / "adapter")})
    assert engine.profile_for("drafter") == PROFILES["compact"] and engine.profile_for(None) == FULL
