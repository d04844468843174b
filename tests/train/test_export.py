"""`specagent export`: layout, model card, and the smoke gate that must load the adapter and
see it change the model — in the transformers engine (fast) and in vLLM (a real subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specagent.export import SmokeGateFailed, export, transformers_factory

pytestmark = pytest.mark.slow


def run_dir(tmp_path: Path, name: str, lora_dir: str, dataset: Path, tokenizer_dir: str, head: bool = False) -> Path:
    """A training output as `specagent train` leaves it: adapter/ (+ tokenizer), config, metrics."""
    from transformers import AutoTokenizer

    from specagent.engines.verdict_head import HeadSpec

    out = tmp_path / name
    shutil.copytree(lora_dir, out / "adapter")
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(str(out / "adapter"))
    if head:
        HeadSpec(threshold=0.4, base_model="smollm2").save(out / "adapter")
    (out / "config.yaml").write_text(yaml.safe_dump({"model": "smollm2", "dataset": str(dataset)}))
    (out / "metrics.json").write_text(json.dumps({"global_step": 3, "calibrated": {"auroc": 0.75}}))
    return out


@pytest.fixture(scope="module")
def zero_lora(smollm2_dir, tmp_path_factory) -> str:
    """peft's default initialisation (B = 0): an adapter that changes nothing."""
    import peft
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("zero") / "lora"
    net = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    peft.get_peft_model(net, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(out)
    return str(out)


def test_drafter_export_passes_the_gate_with_card_and_merged_checkpoint(tmp_path, mined, smollm2_dir, smollm2_lora):
    source = run_dir(tmp_path, "train", smollm2_lora, mined / "drafter", smollm2_dir)
    manifest = export(source, tmp_path / "export", merge_model=True, factory=transformers_factory,
                      max_model_len=8192, backend="transformers")
    out = tmp_path / "export"
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "merged" / "config.json").is_file()
    assert not (tmp_path / "export.partial").exists()
    smoke = manifest["smoke"]
    assert smoke["round"] == "draft" and smoke["decoded_tokens"] > 0
    assert smoke["max_logprob_change"] > 1e-3 and smoke["merged_mean_diff"] < 0.05  # both float32 here
    card = (out / "README.md").read_text()
    for needle in ("base model: `smollm2`", "git SHA", "Smoke gate", "auroc", "Training config", "Data card",
                   "Passed on transformers (float32)", "It does not measure quality"):
        assert needle in card
    assert ("was **malformed**" if smoke["malformed"] else "was well-formed") in card  # the gate's draft, as it was
    assert smoke["dtype"] == "float32"
    recipe = json.loads((out / "vllm.json").read_text())
    assert "--enable-lora" in recipe["server"] and recipe["max_lora_rank"] == 8
    assert json.loads((out / "export.json").read_text())["kind"] == "drafter"


def test_an_adapter_that_changes_nothing_fails_the_gate_and_leaves_no_export(tmp_path, mined, smollm2_dir,
                                                                             zero_lora):
    source = run_dir(tmp_path, "train", zero_lora, mined / "drafter", smollm2_dir)
    with pytest.raises(SmokeGateFailed, match="changes nothing"):
        export(source, tmp_path / "export", factory=transformers_factory, backend="transformers")
    assert not (tmp_path / "export").exists()


def test_a_missing_adapter_is_a_clear_error(tmp_path):
    from specagent.core.errors import ConfigError

    with pytest.raises(ConfigError, match="no trained adapter"):
        export(tmp_path, tmp_path / "export")


def test_a_checkpoint_exports_its_own_adapter_without_trainer_state(tmp_path, mined, smollm2_dir, smollm2_lora):
    source = run_dir(tmp_path, "train", smollm2_lora, mined / "drafter", smollm2_dir)
    checkpoint = source / "checkpoint-2"
    shutil.copytree(source / "adapter", checkpoint)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": [{"loss": 1.0}]}))
    (checkpoint / "optimizer.pt").write_bytes(b"state")
    manifest = export(checkpoint, tmp_path / "export", factory=transformers_factory, backend="transformers")
    assert manifest["metrics"]["checkpoint"] == "checkpoint-2" and manifest["metrics"]["global_step"] == 2
    adapter = tmp_path / "export" / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert not (adapter / "optimizer.pt").exists() and not (adapter / "trainer_state.json").exists()


def test_head_export_scores_steps_without_decoding(tmp_path, mined, smollm2_dir, smollm2_lora):
    source = run_dir(tmp_path, "train", smollm2_lora, mined / "verdict", smollm2_dir, head=True)
    smoke = export(source, tmp_path / "export", factory=transformers_factory, backend="transformers")["smoke"]
    assert smoke["round"] == "verdict (head)" and smoke["decoded_tokens"] == 0
    assert len(smoke["p_valid"]) == len(smoke["labels"]) >= 1 and smoke["threshold"] == 0.4


@pytest.mark.vllm
@pytest.mark.own_engine
def test_cli_export_passes_the_smoke_gate_in_vllm(tmp_path, mined, smollm2_dir, smollm2_lora):
    """What a user runs: `specagent export` loads the adapter in a fresh vLLM engine (its own process)."""
    from tests.conftest import need_vllm

    need_vllm()
    source = run_dir(tmp_path, "train", smollm2_lora, mined / "drafter", smollm2_dir)
    done = subprocess.run([sys.executable, "-m", "specagent", "export", str(source), "-o", str(tmp_path / "export"),
                           "--max-model-len", "4096"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    smoke = json.loads((tmp_path / "export" / "export.json").read_text())["smoke"]
    assert smoke["backend"] == "vllm" and smoke["round"] == "draft" and smoke["max_logprob_change"] > 1e-3
    # (a verdict head through vLLM, 0 decoded tokens: tests/engines/test_vllm_engine.py)


@pytest.mark.vllm
@pytest.mark.own_engine
def test_the_server_command_in_vllm_json_serves_the_adapter_with_tool_calls(tmp_path, mined, smollm2_dir,
                                                                            smollm2_lora):
    """vllm.json's `server` argv, as written by the export, starts a vLLM server that serves
    the adapter by name and returns a parsed tool call (specagent's template, hermes parser)."""
    import os

    import httpx

    from specagent.engines.vllm_server import free_port, healthy
    from tests.conftest import WEATHER, need_vllm, weather_chat

    need_vllm()
    source = run_dir(tmp_path, "train", smollm2_lora, mined / "drafter", smollm2_dir)
    export(source, tmp_path / "export", smoke=False, max_model_len=2048)
    recipe = json.loads((tmp_path / "export" / "vllm.json").read_text())
    argv = [sys.executable, *recipe["server"][1:]]
    assert "--chat-template" in argv and "--tool-call-parser" in argv and "--max-model-len" in argv
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}  # a user's own choice on this CPU (vllm.json says so)
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen([*argv, "--enforce-eager"], stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            if healthy(base) or server.poll() is not None:
                break
            time.sleep(1)
        assert healthy(base), (tmp_path / "server.log").read_text()[-3000:]
        chat = {"messages": [m.to_openai() for m in weather_chat("Paris")], "tools": [WEATHER.to_openai()],
                "max_tokens": 48, "temperature": 0}
        tuned = httpx.post(f"{base}/v1/chat/completions", json={**chat, "model": recipe["lora_name"]}, timeout=120)
        assert tuned.status_code == 200 and tuned.json()["model"] == recipe["lora_name"]  # the adapter, by name
        reply = httpx.post(f"{base}/v1/chat/completions", json={**chat, "model": recipe["base_model"]}, timeout=120)
        message = reply.json()["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        assert all(c["function"]["name"] == "get_weather" for c in calls)
        assert "<tool_call>" not in (message.get("content") or "")  # a call in specagent's format comes back parsed
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
        log.close()


def test_a_merged_drafter_pruned_to_its_rows_tokens_scores_like_base_plus_adapter(tmp_path, mined, smollm2_dir,
                                                                                  smollm2_lora):
    """SmolLM2 + a LoRA, merged, then pruned to the tokens of its training rows: the merged
    checkpoint still reproduces base + adapter, and the pruned one scores like it (the untuned
    SmolLM2 keeps ~half its mass on these few rows' tokens; a trained drafter nearly all)."""
    from transformers import AutoTokenizer

    source = run_dir(tmp_path, "train", smollm2_lora, mined / "drafter", smollm2_dir)
    manifest = export(source, tmp_path / "export", merge_model=True, prune_vocab=True, factory=transformers_factory,
                      max_model_len=8192, backend="transformers")
    merged = tmp_path / "export" / "merged"
    assert manifest["vocab"]["kept"] == len(AutoTokenizer.from_pretrained(merged)) < 49152 // 4
    assert json.loads((merged / "config.json").read_text())["vocab_size"] == manifest["vocab"]["kept"]
    smoke = manifest["smoke"]
    assert smoke["merged_mean_diff"] < 0.05 and 0 < smoke["pruned_mean_diff"] < 1.0
    assert not (tmp_path / "export" / "merged-full").exists()
    assert f"vocabulary pruned to the {manifest['vocab']['kept']:,} of 49,152 tokens" in \
        (tmp_path / "export" / "README.md").read_text()
