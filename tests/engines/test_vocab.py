"""A drafter pruned to its domain's vocabulary (engines/vocab.py): the pruned tokenizer
tokenizes kept text exactly as before and any other text still round-trips; the pruned
model's logits are the full model's at the kept tokens."""

from __future__ import annotations

import json
import random
import string

import pytest

from specagent.engines.vocab import kept_ids, prune_model_dir, prune_tokenizer

pytestmark = pytest.mark.slow

DOMAIN = [
    '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}\n</tool_call>',
    "Your order #W2378156 was delivered on 2024-05-14. Is there anything else I can help with?",
    '{"user_id": "yusuf_rossi_9620", "email": "yusuf.rossi7301@example.com", "status": "pending"}',
]


@pytest.fixture(scope="module")
def full_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def pruned_dir(smollm2_dir, full_tokenizer, tmp_path_factory):
    """A tiny Llama with SmolLM2's tokenizer, pruned to DOMAIN's tokens."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(full_tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, bos_token_id=full_tokenizer.bos_token_id,
                         eos_token_id=full_tokenizer.eos_token_id, pad_token_id=full_tokenizer.eos_token_id,
                         tie_word_embeddings=False)
    root = tmp_path_factory.mktemp("vocab")
    LlamaForCausalLM(config).save_pretrained(root / "full")
    full_tokenizer.save_pretrained(root / "full")
    figures = prune_model_dir(root / "full", root / "pruned", DOMAIN)
    return root, figures


def test_kept_text_tokenizes_as_before_and_any_text_round_trips(pruned_dir, full_tokenizer):
    from transformers import AutoTokenizer

    root, figures = pruned_dir
    pruned = AutoTokenizer.from_pretrained(root / "pruned")
    assert len(pruned) == figures["kept"] < figures["vocab_size"] == len(full_tokenizer)
    old_of = {new: old for new, old in enumerate(kept_ids(json.loads((root / "full/tokenizer.json").read_text()),
                                                           _ids(full_tokenizer, DOMAIN)))}
    rng = random.Random(0)
    kept, checked = set(old_of.values()), 0
    pieces = DOMAIN + [text[start:] for text in DOMAIN for start in range(len(text))]
    for text in pieces:  # any text the full tokenizer writes in kept tokens: the same tokens, renumbered
        full_ids = full_tokenizer(text, add_special_tokens=False)["input_ids"]
        if set(full_ids) <= kept:
            checked += 1
            assert [old_of[i] for i in pruned(text, add_special_tokens=False)["input_ids"]] == full_ids
    assert checked >= 100
    alphabet = string.printable + "éüß€—日本語😀\u200b"
    for _ in range(200):  # anything else: shorter kept pieces that decode to the same text
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
        ids = pruned(text, add_special_tokens=False)["input_ids"]
        assert all(0 <= i < figures["kept"] for i in ids) and pruned.decode(ids) == text
    assert pruned.convert_tokens_to_ids("<|im_end|>") == pruned.eos_token_id == old_of_inverse(old_of, 2)


def old_of_inverse(old_of: dict[int, int], old: int) -> int:
    return next(new for new, o in old_of.items() if o == old)


def _ids(tokenizer, texts):
    return {i for text in texts for i in tokenizer(text, add_special_tokens=False)["input_ids"]}


def test_pruned_logits_are_the_full_logits_at_the_kept_tokens(pruned_dir, full_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, figures = pruned_dir
    assert sorted(figures["sliced"]) == ["lm_head.weight", "model.embed_tokens.weight"]
    full = AutoModelForCausalLM.from_pretrained(root / "full").eval()
    pruned = AutoModelForCausalLM.from_pretrained(root / "pruned").eval()
    assert pruned.config.vocab_size == figures["kept"]
    keep = kept_ids(json.loads((root / "full/tokenizer.json").read_text()), _ids(full_tokenizer, DOMAIN))
    text = DOMAIN[0]
    with torch.no_grad():
        full_logits = full(**full_tokenizer(text, return_tensors="pt")).logits
        pruned_logits = pruned(**AutoTokenizer.from_pretrained(root / "pruned")(text, return_tensors="pt")).logits
    torch.testing.assert_close(pruned_logits, full_logits[..., keep])


def test_a_tokenizer_that_is_not_bpe_is_refused():
    with pytest.raises(ValueError, match="BPE"):
        kept_ids({"model": {"type": "WordPiece", "vocab": {}}}, [])


def test_merges_are_kept_only_with_their_result_and_in_order():
    tokenizer = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "bc": 5},
                           "merges": [["a", "b"], ["b", "c"], ["ab", "c"]]},
                 "added_tokens": []}
    keep = kept_ids(tokenizer, [4])  # "abc" brings "ab" and "c", "ab" brings "a" and "b"; "bc" is not needed
    assert [k for k in keep if k <= 5] == [0, 1, 2, 3, 4]
    pruned = prune_tokenizer(tokenizer, keep)
    assert pruned["model"]["merges"] == [["a", "b"], ["ab", "c"]] and "bc" not in pruned["model"]["vocab"]
