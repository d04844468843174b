"""A drafter derived from the strong model: its first k decoder layers and LM head, tuned on
its own data (`from_layers`). It trains, exports as a full checkpoint, loads in both
engines, and the memory-traffic accounting counts the bytes the engine really loads."""

from __future__ import annotations

import json

import pytest

from specagent.engines.render import PROFILES, PromptProfile
from tests.helpers.training import drafter_cfg

pytest.importorskip("trl")


@pytest.fixture
def strong_dir(tmp_path, tokenizer):
    """A tiny 4-layer "strong model" saved as a checkpoint dir with the compact profile."""
    import torch
    from transformers import LlamaForCausalLM

    from tests.train.conftest import tiny_llama_config

    torch.manual_seed(0)
    out = tmp_path / "strong"
    LlamaForCausalLM(tiny_llama_config(tokenizer, num_hidden_layers=4, tie_word_embeddings=True)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    PROFILES["compact"].save(out)
    return out


def loaded_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_drafter_cut_from_the_strong_model_trains_exports_and_costs_less(mined, strong_dir, tmp_path):
    from specagent.engines.transformers_engine import TransformersEngine
    from specagent.export import export, transformers_factory
    from specagent.train.drafter import train_drafter

    cfg = drafter_cfg(mined, tmp_path, f"model={strong_dir}", "from_layers=2", "lora=null", "train.max_steps=2",
                      "max_length=4096")
    train_drafter(cfg)
    model_dir = tmp_path / "out" / "model"
    assert json.loads((model_dir / "config.json").read_text())["num_hidden_layers"] == 2
    assert PromptProfile.load(model_dir) == PROFILES["compact"]  # inherited from the strong model's dir
    manifest = export(tmp_path / "out", tmp_path / "export", factory=transformers_factory, backend="transformers")
    assert manifest["full_model"] and manifest["smoke"]["max_logprob_change"] > 1e-3
    strong = TransformersEngine(str(strong_dir))
    drafter = TransformersEngine(str(tmp_path / "export" / "model"))
    assert drafter.profile_for(None) == PROFILES["compact"]
    # the accounting reads what the engine loaded: embeddings (tied LM head) once, 2 of 4 layers
    assert drafter.cost.weight_bytes == loaded_bytes(drafter.model) < strong.cost.weight_bytes == loaded_bytes(strong.model)
    per_layer = sum(p.numel() * 4 for p in strong.model.model.layers[0].parameters())
    assert strong.cost.weight_bytes - drafter.cost.weight_bytes == 2 * per_layer
    assert drafter.cost.kv_bytes_per_token * 2 == strong.cost.kv_bytes_per_token
    assert manifest["smoke"]["weight_bytes"] == drafter.cost.weight_bytes
    assert manifest["smoke"]["source_weight_bytes"] == strong.cost.weight_bytes


def test_a_lora_adds_its_own_bytes_to_the_passes_through_it(strong_dir, tokenizer, tmp_path):
    import peft
    from transformers import AutoModelForCausalLM

    from specagent.engines.models import adapter_parameters
    from specagent.engines.transformers_engine import TransformersEngine

    lora = tmp_path / "lora"
    net = AutoModelForCausalLM.from_pretrained(strong_dir)
    peft.get_peft_model(net, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(lora)
    engine = TransformersEngine(str(strong_dir), adapters={"drafter": str(lora)})
    lora_params = adapter_parameters(lora)
    assert lora_params == 4 * 4 * ((16 + 16) + (16 + 8))  # 4 layers x rank 4 x (q: 16 -> 16, v: 16 -> 8)
    assert engine.cost.for_adapter("drafter").weight_bytes == engine.cost.weight_bytes + 4 * lora_params
    assert engine.cost.for_adapter(None) == engine.cost


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.own_engine
def test_vllm_loads_a_cut_checkpoint_and_counts_its_bytes(smollm2_dir, tmp_path):
    """SmolLM2 cut to 8 of its 30 layers loads in vLLM (its own process); its weight bytes are
    the parameters of the cut model at vLLM's dtype, under half of the full model's."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specagent.train.drafter import first_layers
    from tests.conftest import need_vllm

    need_vllm()
    full = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    full_params = sum(p.numel() for p in full.parameters())
    cut = first_layers(full, 8)
    cut_params = sum(p.numel() for p in cut.parameters())
    cut.save_pretrained(tmp_path / "cut")
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(tmp_path / "cut")
    code = ("from specagent.engines.vllm_engine import VLLMEngine\n"
            "if __name__ == '__main__':\n"
            f"    e = VLLMEngine({str(tmp_path / 'cut')!r}, max_model_len=1024, engine_kwargs={{'enforce_eager': True}})\n"
            "    print('BYTES', e.cost.weight_bytes, e.llm.model_config.hf_config.num_hidden_layers); e.close()\n")
    (tmp_path / "load.py").write_text(code)
    done = subprocess.run([sys.executable, str(tmp_path / "load.py")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _, weight_bytes, layers = next(line for line in done.stdout.splitlines() if line.startswith("BYTES")).split()
    assert int(layers) == 8 and int(weight_bytes) == cut_params * 2  # bfloat16 on vLLM-CPU
    assert cut_params < 0.5 * full_params


def test_a_drafter_from_listed_layers_skips_the_middle_and_loads_as_an_ordinary_checkpoint(strong_dir, tmp_path):
    """from_layers: [0, 3] keeps the first and the last layer of four, renumbered 0 and 1: the
    saved checkpoint's weights are those layers' own, and it generates with a KV cache."""
    import torch
    from transformers import AutoModelForCausalLM

    from specagent.train.drafter import first_layers

    full = AutoModelForCausalLM.from_pretrained(strong_dir)
    last = {k: v.clone() for k, v in full.model.layers[3].state_dict().items()}
    cut = first_layers(full, [0, 3])
    assert [layer.self_attn.layer_idx for layer in cut.model.layers] == [0, 1]
    cut.save_pretrained(tmp_path / "cut")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "cut")
    assert loaded.config.num_hidden_layers == 2
    for name, tensor in loaded.model.layers[1].state_dict().items():
        assert torch.equal(tensor, last[name]), name
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():  # cached decoding equals a full forward pass (layer_idx indexes the cache)
        step = loaded.generate(ids, max_new_tokens=3, do_sample=False)
        again = loaded(step).logits[0, -4:-1].argmax(-1)
    assert torch.equal(step[0, -3:], again)


@pytest.mark.parametrize("layers", [[], [2, 1], [0, 0], [-1, 2]])
def test_the_schema_refuses_an_empty_unordered_or_repeated_list_of_layers(layers):
    from pydantic import ValidationError

    from specagent.config import DrafterTrainConfig

    with pytest.raises(ValidationError):
        DrafterTrainConfig(dataset="d", from_layers=layers)


@pytest.mark.parametrize("layers", [[0, 9], [0, 1, 2, 3], 4])
def test_a_cut_past_the_model_or_keeping_every_layer_is_refused(strong_dir, layers):
    from transformers import AutoModelForCausalLM

    from specagent.core.errors import ConfigError
    from specagent.train.drafter import first_layers

    with pytest.raises(ConfigError, match="decoder layers"):
        first_layers(AutoModelForCausalLM.from_pretrained(strong_dir), layers)


def test_a_quantized_checkpoint_holds_int8_linear_weights_within_a_step(strong_dir, tmp_path):
    """`export --quantize w8a8`'s step alone: every Linear but the LM head becomes int8 with a
    scale per output channel (dequantized, each weight within one step of the original: half a
    step of rounding, and the scale itself is stored in bf16);
    the embeddings stay float; the byte count the vLLM engine uses drops accordingly."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from specagent.engines.quantize import quantize
    from specagent.engines.vllm_engine import checkpoint_bytes

    out = quantize(strong_dir, tmp_path / "q")
    tensors = load_file(str(out / "model.safetensors"))
    original = AutoModelForCausalLM.from_pretrained(strong_dir, dtype=torch.bfloat16).state_dict()
    linear = [n for n in original if n.endswith("proj.weight")]
    assert len(linear) == 4 * 7  # q, k, v, o, gate, up, down in each of 4 layers
    for name in linear:
        q, scale = tensors[name], tensors[name.replace(".weight", ".weight_scale")].float()
        assert q.dtype == torch.int8 and scale.shape == (q.shape[0], 1)
        assert ((q.float() * scale - original[name].float()).abs() <= scale).all(), name
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "int-quantized" and config["ignore"] == ["lm_head"]
    group = config["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["input_activations"]["dynamic"] is True
    assert PromptProfile.load(out) == PROFILES["compact"]  # the serving profile travels with the weights
    hf = AutoConfig.from_pretrained(strong_dir)
    assert checkpoint_bytes(str(out), hf, 2) < checkpoint_bytes(str(strong_dir), hf, 2)


def test_export_refuses_to_quantize_an_adapter_or_gate_it_off_vllm(mined, strong_dir, tmp_path):
    from specagent.core.errors import ConfigError
    from specagent.export import export, transformers_factory
    from specagent.train.drafter import train_drafter

    train_drafter(drafter_cfg(mined, tmp_path, f"model={strong_dir}", "from_layers=2", "lora=null",
                              "train.max_steps=1", "max_length=4096"))
    with pytest.raises(ConfigError, match="--backend vllm"):
        export(tmp_path / "out", tmp_path / "export", factory=transformers_factory, backend="transformers",
               quantize="w8a8")
    train_drafter(drafter_cfg(mined, tmp_path, f"model={strong_dir}", "output_dir=" + str(tmp_path / "lora"),
                              "train.max_steps=1", "max_length=4096"))
    with pytest.raises(ConfigError, match="trained an adapter"):
        export(tmp_path / "lora", tmp_path / "export", quantize="w8a8")
    assert not (tmp_path / "export").exists()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.own_engine
def test_vllm_serves_a_quantized_cut_and_counts_its_int8_bytes(smollm2_dir, tmp_path):
    """SmolLM2 cut to 8 layers, quantized W8A8, in vLLM (its own process): it loads and
    generates, and its weight bytes are the int8 linear layers at one byte plus the bf16
    embeddings, norms and scales (the float cut: every parameter at two)."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specagent.engines.quantize import quantize
    from specagent.train.drafter import first_layers
    from tests.conftest import need_vllm

    need_vllm()
    cut = first_layers(AutoModelForCausalLM.from_pretrained(smollm2_dir), 8)
    embed = cut.model.embed_tokens.weight.numel()
    linear = sum(m.weight.numel() for n, m in cut.named_modules() if n.endswith("proj"))
    norms = sum(p.numel() for n, p in cut.named_parameters() if "norm" in n)
    cut.save_pretrained(tmp_path / "cut")
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(tmp_path / "cut")
    quantize(tmp_path / "cut", tmp_path / "q")
    code = ("from specagent.core.interfaces import ChatRequest\n"
            "from specagent.core.types import Message\n"
            "from specagent.engines.vllm_engine import VLLMEngine\n"
            "import sys\n"
            "if __name__ == '__main__':\n"
            "    e = VLLMEngine(sys.argv[1], max_model_len=1024, engine_kwargs={'enforce_eager': True})\n"
            "    out = e.chat([ChatRequest(messages=[Message(role='user', content='Where is my order?')], "
            "max_tokens=8)])[0]\n"
            "    print('BYTES', e.cost.weight_bytes, out.usage.completion_tokens); e.close()\n")
    (tmp_path / "load.py").write_text(code)
    figures = {}
    for name in ("cut", "q"):
        done = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(tmp_path / name)], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        figures[name] = [int(v) for v in next(l for l in done.stdout.splitlines() if l.startswith("BYTES")).split()[1:]]
    assert figures["cut"][0] == 2 * (embed + linear + norms)
    scales = 2 * sum(m.weight.shape[0] for n, m in cut.named_modules() if n.endswith("proj"))
    assert figures["q"][0] == 2 * (embed + norms) + linear + scales
    assert figures["q"][1] > 0


def test_a_pruned_cut_keeps_its_rows_tokens_and_the_gate_refuses_a_model_spread_over_all(mined, strong_dir, tmp_path):
    """`export --prune-vocab`: model/ keeps only the tokens of the drafter's training rows (its
    embedding and tokenizer shrink with them). An untrained tiny model spreads its mass over the
    whole vocabulary, so the pruned one scores unlike it and the gate refuses it."""
    from transformers import AutoTokenizer

    from specagent.core.errors import ConfigError
    from specagent.engines.transformers_engine import TransformersEngine
    from specagent.export import SmokeGateFailed, export, transformers_factory
    from specagent.train.drafter import train_drafter

    train_drafter(drafter_cfg(mined, tmp_path, f"model={strong_dir}", "from_layers=2", "lora=null",
                              "train.max_steps=1", "max_length=4096"))
    with pytest.raises(SmokeGateFailed, match="training rows miss tokens"):
        export(tmp_path / "out", tmp_path / "export", factory=transformers_factory, backend="transformers",
               prune_vocab=True)
    assert not (tmp_path / "export").exists()
    manifest = export(tmp_path / "out", tmp_path / "export", smoke=False, prune_vocab=True)
    model = tmp_path / "export" / "model"
    kept = manifest["vocab"]["kept"]
    assert 256 < kept < manifest["vocab"]["vocab_size"] == len(AutoTokenizer.from_pretrained(strong_dir))
    assert json.loads((model / "config.json").read_text())["vocab_size"] == kept == len(AutoTokenizer.from_pretrained(model))
    assert not (tmp_path / "export" / "model-full").exists()
    drafter = TransformersEngine(str(model))
    assert drafter.cost.weight_bytes == loaded_bytes(drafter.model)
    assert drafter.profile_for(None) == PROFILES["compact"]
    train_drafter(drafter_cfg(mined, tmp_path, f"model={strong_dir}", "output_dir=" + str(tmp_path / "lora"),
                              "train.max_steps=1", "max_length=4096"))
    with pytest.raises(ConfigError, match="--prune-vocab"):
        export(tmp_path / "lora", tmp_path / "export-lora", prune_vocab=True)
    assert not (tmp_path / "export-lora.partial").exists()  # refused before anything is built
