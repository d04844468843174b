"""A ChatEngine on plain transformers: any causal LM (hub id, dir or GGUF), optional LoRA adapters.

The reference backend: slow but exact, it runs anywhere torch runs and is what unit
tests wrap around tiny in-process models. Decoding is a small batched loop over the
model's forward with a KV cache, so token accounting (DESIGN §3) and seeded sampling
are under our control rather than inferred from `generate`'s output.
"""

from __future__ import annotations

import os
import time
import typing
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from specagent.core.errors import ContextLengthExceeded, EngineError
from specagent.core.interfaces import ChatRequest, Completion, ModelCost, ScoreRequest, Scores
from specagent.core.toolcalls import parse_assistant_text
from specagent.core.types import Dtype, Usage
from specagent.engines.models import adapter_parameters, materialize
from specagent.engines.render import FULL, PromptProfile, render_prompt

STOP_TOKEN = "<|im_end|>"
DTYPES = typing.get_args(Dtype)  # float32, bfloat16, float16, auto (the checkpoint's own)


@dataclass(frozen=True)
class _Generated:
    """New token ids of one request (stop token included if generated) and whether it stopped;
    ``unsure``: it stopped at a position whose top token fell below ``stop_below`` (not in ``ids``)."""

    ids: list[int]
    stopped: bool
    unsure: bool = False


class TransformersEngine:
    """Chat with tools on a transformers causal LM; greedy at temperature 0, else seeded sampling.

    `model` is a hub id, a checkpoint dir, a `.gguf` path or the alias "smollm2"; GGUF
    files are dequantized once into a cached checkpoint dir (`models.materialize`).
    `adapters` maps names to peft LoRA dirs; `ChatRequest.adapter` picks one by name
    (or by a dir path, loaded on first use), None runs the base weights. `threads` sets
    torch's (process-wide) CPU thread count; None: the cores this process may use.
    """

    continues_messages = True  # honours ChatRequest.continuation
    stops_unsure = True  # honours ChatRequest.stop_below

    def __init__(
        self,
        model: str,
        gguf_file: str | None = None,
        adapters: dict[str, str] | None = None,
        dtype: str = "float32",
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        max_model_len: int = 2048,
        batch_size: int = 8,
        model_name: str | None = None,
        threads: int | None = None,
    ) -> None:
        if dtype not in DTYPES:
            raise EngineError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        path = materialize(model, gguf_file)
        tokenizer = AutoTokenizer.from_pretrained(path)
        net = AutoModelForCausalLM.from_pretrained(path, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
        self._setup(net, tokenizer, adapters, temperature, top_p, seed, max_model_len, batch_size,
                    model_name or model, threads, PromptProfile.load(path))

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        tokenizer: Any,
        adapters: dict[str, str] | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        max_model_len: int = 2048,
        batch_size: int = 8,
        model_name: str = "in-process",
        threads: int | None = None,
    ) -> "TransformersEngine":
        """Wrap a model already in memory (tests: tiny random models). Adapters are injected in place."""
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, adapters, temperature, top_p, seed, max_model_len, batch_size, model_name,
                      threads, FULL)
        return engine

    def _setup(self, net, tokenizer, adapters, temperature, top_p, seed, max_model_len, batch_size, model_name,
               threads, profile):
        # torch sizes its pool by the host's cores; stay within the cores this process may use.
        # On a box shared with another busy process, threads=1 decodes far faster (OpenMP spin-waits).
        torch.set_num_threads(threads or max(1, min(torch.get_num_threads(), len(os.sched_getaffinity(0)))))
        net.eval()
        self.model_name = model_name
        self.cost = model_cost(net)
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_model_len = max_model_len
        self.batch_size = batch_size
        self._generator = torch.Generator().manual_seed(seed)
        self._stop_ids = stop_token_ids(net, tokenizer)
        self._pad_id = next(i for i in (tokenizer.pad_token_id, *sorted(self._stop_ids), 0) if i is not None)
        self.adapters: dict[str, str] = {}
        self.profiles: dict[str | None, PromptProfile] = {None: profile}  # the base weights' and each adapter's
        self.model = net
        for name, path in (adapters or {}).items():
            self._load_adapter(name, path)

    def _load_adapter(self, name: str, path: str) -> None:
        from peft import PeftModel

        if not self.adapters:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
        else:
            self.model.load_adapter(path, adapter_name=name)
        self.model.eval()
        self.adapters[name] = path
        extra = adapter_parameters(path) * next(self.model.parameters()).element_size()
        self.cost = replace(self.cost, adapter_bytes={**self.cost.adapter_bytes, name: extra})
        self.profiles[name] = PromptProfile.load(path) if PromptProfile.saved_in(path) else self.profiles[None]

    def profile_for(self, adapter: str | None) -> PromptProfile:
        """The prompt profile requests on `adapter` (None: the base weights) are rendered with."""
        return self.profiles.get(adapter, self.profiles[None])

    def close(self) -> None:
        """The weights are freed with the engine; nothing runs beside it."""

    def chat(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Answer every request; requests sharing an adapter are generated together in batches."""
        prompts = [self._prompt_ids(r) for r in requests]
        groups: dict[str | None, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            groups[request.adapter].append(i)
        for adapter in groups:
            self._ensure_adapter(adapter)  # fail before any work is done
        results: list[Completion | None] = [None] * len(requests)
        for adapter, indices in groups.items():
            indices.sort(key=lambda i: len(prompts[i]))  # similar lengths batch with less padding
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                began = time.perf_counter()
                max_new = [requests[i].max_tokens for i in chunk]
                below = [requests[i].stop_below for i in chunk]
                generated = self._generate_with(adapter, [prompts[i] for i in chunk], max_new, below)
                share = (time.perf_counter() - began) / len(chunk)
                for i, gen in zip(chunk, generated):
                    results[i] = self._completion(requests[i], len(prompts[i]), gen, share)
        return results  # type: ignore[return-value]

    def score(self, requests: Sequence[ScoreRequest]) -> list[Scores]:
        """Candidate log-probabilities at chosen positions: one prefill per request, nothing decoded."""
        for request in requests:
            self._ensure_adapter(request.adapter)
            if request.own and any(p + 1 >= len(request.token_ids) for p in request.positions):
                raise EngineError("score: an `own` position must be followed by a prompt token")
            if len(request.token_ids) > self.max_model_len:
                raise ContextLengthExceeded(f"{self.model_name}: scoring a prompt of {len(request.token_ids)} "
                                            f"tokens > max_model_len {self.max_model_len}")
        out = []
        for request in requests:
            began = time.perf_counter()
            logprobs = self._score_with(request)
            usage = Usage(prompt_tokens=len(request.token_ids), seconds=time.perf_counter() - began)
            out.append(Scores(logprobs=logprobs, usage=usage))
        return out

    def _score_with(self, request: ScoreRequest) -> list[list[float]]:
        if request.adapter is not None:
            self.model.set_adapter(request.adapter)
            return self._score(request)
        if not self.adapters:
            return self._score(request)
        with self.model.disable_adapter():
            return self._score(request)

    @torch.inference_mode()
    def _score(self, request: ScoreRequest) -> list[list[float]]:
        ids = torch.tensor([list(request.token_ids)], dtype=torch.long)
        keep = torch.tensor(list(request.positions), dtype=torch.long)  # logits at these positions only
        logits = self.model(input_ids=ids, logits_to_keep=keep).logits[0].float()
        if request.own:  # the prompt's own next token at each position, and whether it is the top one
            targets = torch.tensor([request.token_ids[p + 1] for p in request.positions], dtype=torch.long)
            own = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
            top = logits.argmax(dim=-1) == targets
            return [[lp, float(t)] for lp, t in zip(own.tolist(), top.tolist())]
        logprobs = torch.log_softmax(logits, dim=-1)[:, list(request.candidates)]
        return logprobs.tolist()

    def _prompt_ids(self, request: ChatRequest) -> list[int]:
        text = render_prompt(self.tokenizer, request.messages, request.tools, profile=self.profile_for(request.adapter))
        ids = self.tokenizer(text + request.continuation, add_special_tokens=False)["input_ids"]
        if len(ids) + request.max_tokens > self.max_model_len:
            raise ContextLengthExceeded(
                f"{self.model_name}: prompt of {len(ids)} tokens + max_tokens {request.max_tokens} = "
                f"{len(ids) + request.max_tokens} exceeds max_model_len {self.max_model_len}; "
                "shorten the context or lower max_tokens"
            )
        return ids

    def _completion(self, request: ChatRequest, prompt_tokens: int, gen: _Generated, seconds: float) -> Completion:
        text_ids = gen.ids[:-1] if gen.stopped else gen.ids
        text = request.continuation + self.tokenizer.decode(text_ids, skip_special_tokens=False)
        message, malformed = parse_assistant_text(text, request.tools)
        decoded = len(gen.ids) + gen.unsure  # the pass that found the unsure position ran too
        usage = Usage(prompt_tokens=prompt_tokens, cached_tokens=0, completion_tokens=decoded, seconds=seconds)
        return Completion(text=text, message=message, usage=usage, malformed=malformed,
                          finish_reason="unsure" if gen.unsure else "stop" if gen.stopped else "length")

    def _ensure_adapter(self, adapter: str | None) -> None:
        """A requested adapter is one loaded by name, or a peft dir loaded now under its path."""
        if adapter is None or adapter in self.adapters:
            return
        if not os.path.isdir(adapter):
            known = ", ".join(self.adapters) or "none"
            raise EngineError(
                f"{self.model_name}: unknown adapter {adapter!r}; pass it in `adapters` (known: {known}) "
                "or give the path of a peft adapter dir"
            )
        self._load_adapter(adapter, adapter)

    def _generate_with(self, adapter: str | None, prompts: list[list[int]], max_new: list[int],
                       below: list[float]) -> list[_Generated]:
        if adapter is not None:
            self.model.set_adapter(adapter)
            return self._generate(prompts, max_new, below)
        if not self.adapters:
            return self._generate(prompts, max_new, below)
        with self.model.disable_adapter():
            return self._generate(prompts, max_new, below)

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], max_new: list[int], below: list[float] | None = None
                  ) -> list[_Generated]:
        """Decode a left-padded batch until every row stopped or spent its budget; a row with
        ``below[row]`` > 0 also stops, writing nothing there, where its top token's probability
        falls below it (the model's own temperature-1 distribution)."""
        below = below or [0.0] * len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out: list[list[int]] = [[] for _ in prompts]
        done = [m <= 0 for m in max_new]
        unsure = [False] * len(prompts)
        while not all(done):
            logits = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                                past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
            chosen = self._pick(logits).tolist()
            top = torch.softmax(logits.float(), dim=-1).max(dim=-1).values.tolist() if any(below) else None
            for row, token in enumerate(chosen):
                if not done[row] and top is not None and top[row] < below[row]:
                    done[row] = unsure[row] = True
                if done[row]:
                    chosen[row] = self._pad_id
                    continue
                out[row].append(token)
                done[row] = token in self._stop_ids or len(out[row]) >= max_new[row]
            input_ids = torch.tensor(chosen, dtype=torch.long)[:, None]
            attention = torch.cat([attention, torch.ones((len(prompts), 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
        return [_Generated(ids, bool(ids) and ids[-1] in self._stop_ids, u) for ids, u in zip(out, unsure)]

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """Next token per row: argmax at temperature 0, else nucleus sampling from the seeded generator."""
        if self.temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(dim=-1) - sorted_probs > self.top_p  # keeps at least the top token
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        return torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)


def stop_token_ids(model: PreTrainedModel, tokenizer: Any) -> frozenset[int]:
    """<|im_end|> (the template's turn end) plus every eos id the tokenizer and model declare."""
    ids: set[Any] = {tokenizer.eos_token_id}
    if STOP_TOKEN in tokenizer.get_vocab():
        ids.add(tokenizer.convert_tokens_to_ids(STOP_TOKEN))
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return frozenset(i for i in ids if isinstance(i, int))


def model_cost(model: PreTrainedModel) -> ModelCost:
    """Weight bytes (shared tensors once) and KV-cache bytes per token of a decoder."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    kv_bytes_per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * element  # K and V
    return ModelCost(weight_bytes=weight_bytes, kv_bytes_per_token=kv_bytes_per_token,
                     dtype=str(next(model.parameters()).dtype).removeprefix("torch."))
