"""The counters of `specagent serve` since it started, as JSON or in Prometheus' text format."""

from __future__ import annotations

import threading
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily

from specagent.core.accounting import Ledger
from specagent.core.metrics import token_table
from specagent.core.protocol import Episode

COUNTERS = {
    "episodes": "Episodes run (POST /v1/episodes).",
    "chat_turns": "Chat-completion turns answered (POST /v1/chat/completions).",
    "drafted_steps": "Steps the weak model drafted.",
    "accepted_steps": "Drafted steps the verifier accepted.",
    "held_approved": "Held state-changing steps approved and executed.",
    "repairs": "Steps the strong model repaired.",
}


class ServiceMetrics:
    """Sums over every episode and chat turn; safe to read while a request runs."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.ledger = Ledger()
        self._lock = threading.Lock()

    def add(self, ep: Episode, chat: bool) -> None:
        counts = ep.counts()
        with self._lock:
            self.counts["chat_turns" if chat else "episodes"] += 1
            for key in ("drafted_steps", "accepted_steps", "held_approved", "repairs"):
                self.counts[key] += counts[key]
            self.ledger.merge(ep.ledger)

    def to_json(self) -> dict[str, Any]:
        """The counters, tokens per model and role (prefill new / cached, decode), and what
        crossed the network to remote engines."""
        with self._lock:
            return {**self.counts, "tokens": token_table(self.ledger), "network": self.ledger.network_json()}

    def prometheus(self) -> bytes:
        """The same numbers in Prometheus' text exposition format."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(self.to_json()))
        return generate_latest(registry)


class _Snapshot:
    """A prometheus_client collector over one `ServiceMetrics.to_json` snapshot."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, help_text in COUNTERS.items():
            yield CounterMetricFamily(f"specagent_{name}", help_text, value=self.snapshot[name])
        tokens = CounterMetricFamily("specagent_tokens", "Model tokens by model, role and phase.",
                                     labels=["model", "role", "phase"])
        for model, roles in self.snapshot["tokens"].items():
            for role, phases in roles.items():
                for phase, value in phases.items():
                    tokens.add_metric([model, role, phase], value)
        yield tokens
        network = CounterMetricFamily("specagent_network", "Requests, tokens and body bytes sent to and "
                                      "received from remote engines.", labels=["model", "role", "count"])
        for model, roles in self.snapshot["network"]["by_model"].items():
            for role, counts in roles.items():
                for count, value in counts.items():
                    network.add_metric([model, role, count], value)
        yield network
