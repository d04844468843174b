"""The accounting of DESIGN §3: tokens, forward passes, wall time and memory traffic,
per model (``strong`` / ``weak``) and role (``draft``, ``verdict``, ``repair``, ``act``);
and, for a model behind a remote endpoint (the edge–cloud split), what crossed the network.

Every model call goes through ``Ledger.record`` exactly once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Iterable

from specagent.core.interfaces import ModelCost
from specagent.core.types import Usage

ROLES = ("draft", "verdict", "repair", "act")


@dataclass
class RoleStats:
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    decode_tokens: int = 0
    prefill_passes: int = 0
    decode_passes: int = 0
    seconds: float = 0.0
    memory_bytes: float = 0.0
    # remote calls only: what crossed the network
    network_requests: int = 0
    network_prompt_tokens: int = 0
    network_completion_tokens: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    @property
    def forward_passes(self) -> int:
        return self.prefill_passes + self.decode_passes

    def add(self, other: "RoleStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def call_stats(usage: Usage, cost: ModelCost) -> RoleStats:
    """Passes and bytes of one call.

    Prefill: the new (uncached) prompt tokens in chunks of ``cost.prefill_chunk``; each
    chunk is one pass reading the weights and the KV cache up to its end (at least one
    pass: an engine recomputes the last prompt token even on a full cache hit).
    Decode: each generated token is one pass over the weights and the whole KV cache.
    """
    new = max(usage.prompt_tokens - usage.cached_tokens, 0)
    chunks = max(1, math.ceil(new / cost.prefill_chunk))
    prefill_bytes = 0.0
    for i in range(chunks):
        end = min(usage.cached_tokens + (i + 1) * cost.prefill_chunk, usage.prompt_tokens)
        prefill_bytes += cost.weight_bytes + cost.kv_bytes_per_token * end
    n, p = usage.completion_tokens, usage.prompt_tokens
    decode_bytes = n * cost.weight_bytes + cost.kv_bytes_per_token * (n * p + n * (n - 1) / 2)
    remote = usage.requests > 0
    return RoleStats(
        calls=1,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        decode_tokens=n,
        prefill_passes=chunks,
        decode_passes=n,
        seconds=usage.seconds,
        memory_bytes=prefill_bytes + decode_bytes,
        network_requests=usage.requests,
        network_prompt_tokens=p if remote else 0,
        network_completion_tokens=n if remote else 0,
        bytes_sent=usage.bytes_sent,
        bytes_received=usage.bytes_received,
    )


def network_counts(stats: RoleStats) -> dict[str, int]:
    """The network part of ``stats``, under the names of an OpenAI ``usage`` object."""
    return {
        "requests": stats.network_requests,
        "prompt_tokens": stats.network_prompt_tokens,
        "completion_tokens": stats.network_completion_tokens,
        "bytes_sent": stats.bytes_sent,
        "bytes_received": stats.bytes_received,
    }


class Ledger:
    """Per (model, role) sums for one episode (or, merged, for many)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], RoleStats] = {}

    def record(self, model: str, role: str, usage: Usage, cost: ModelCost) -> RoleStats:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        stats = call_stats(usage, cost)
        self.entries.setdefault((model, role), RoleStats()).add(stats)
        return stats

    def total(self, model: str | None = None, roles: Iterable[str] = ROLES) -> RoleStats:
        out = RoleStats()
        for (m, r), stats in self.entries.items():
            if (model is None or m == model) and r in roles:
                out.add(stats)
        return out

    def to_json(self) -> dict[str, dict[str, dict[str, float]]]:
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (model, role), stats in sorted(self.entries.items()):
            out.setdefault(model, {})[role] = dict(asdict(stats), forward_passes=stats.forward_passes)
        return out

    def network_json(self) -> dict[str, dict]:
        """What crossed the network: the total, and per model and role that called a remote engine."""
        by_model: dict[str, dict[str, dict[str, int]]] = {}
        for (model, role), stats in sorted(self.entries.items()):
            if stats.network_requests:
                by_model.setdefault(model, {})[role] = network_counts(stats)
        return {"total": network_counts(self.total()), "by_model": by_model}

    @classmethod
    def from_json(cls, raw: dict) -> "Ledger":
        """A ledger from ``to_json``; fields a record predates (the network counts) read as 0."""
        ledger = cls()
        for model, roles in raw.items():
            for role, stats in roles.items():
                values = {f.name: stats.get(f.name, f.default) for f in fields(RoleStats)}
                ledger.entries[(model, role)] = RoleStats(**values)
        return ledger

    def merge(self, other: "Ledger") -> None:
        for key, stats in other.entries.items():
            self.entries.setdefault(key, RoleStats()).add(stats)
