"""Prometheus counters by key: labelled with the key's name (C{anonymous} for others), never the key."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

#: The families labelled by key name: a normal key sees only its own samples of them.
KEY_FAMILIES = frozenset({"mrunner_key_requests", "mrunner_key_tokens", "mrunner_key_rate_limited"})


class KeyMetrics:
    """Requests, tokens and refusals per key name; labelled children kept, as in L{mrunner.daemon.metrics}."""

    def __init__(self, registry: CollectorRegistry):
        self._requests = Counter(
            "mrunner_key_requests",
            "Inference requests by key name and HTTP status.",
            ["key", "status"],
            registry=registry,
        )
        self._tokens = Counter(
            "mrunner_key_tokens",
            "Tokens by key name and kind (prompt, completion).",
            ["key", "kind"],
            registry=registry,
        )
        self._limited = Counter(
            "mrunner_key_rate_limited", "Requests refused with a 429 by key name.", ["key"], registry=registry
        )
        self._children: dict[tuple[object, ...], Any] = {}

    def _child(self, counter: Counter, *labels: str) -> Any:
        child = self._children.get((counter, *labels))
        if child is None:
            child = self._children[(counter, *labels)] = counter.labels(*labels)
        return child

    def ended(self, key: str, status: int, prompt: int, completion: int) -> None:
        self._child(self._requests, key, str(status)).inc()
        if prompt:
            self._child(self._tokens, key, "prompt").inc(prompt)
        if completion:
            self._child(self._tokens, key, "completion").inc(completion)

    def limited(self, key: str) -> None:
        self._child(self._limited, key).inc()
