"""The prompt cache's counts in C{/metrics}: hits, misses, restores, failed restores, saves, files, bytes."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mrunner.cache.turns import PromptCache

COUNTERS = (
    ("hits", "Turns that found their conversation in a slot: still held, or restored from a saved state."),
    ("misses", "Turns of a runner that saves slots that found none of their conversation."),
    ("restores", "Saved slot states restored for a turn they begin."),
    ("failed_restores", "Restores the runner refused (the state file then removed); the turn went on."),
    ("saves", "Slot states saved before a planned stop."),
    ("saved_bytes", "Bytes of slot states saved before planned stops."),
    ("restored_tokens", "Prompt tokens restored from saved states rather than read again."),
)


class CacheCollector(Collector):
    def __init__(self, cache: PromptCache):
        self._cache = cache

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        counts = self._cache.counts
        for name, text in COUNTERS:
            yield CounterMetricFamily(f"mrunner_prompt_cache_{name}", text, value=getattr(counts, name))
        store = self._cache.store
        yield GaugeMetricFamily("mrunner_prompt_cache_files", "Saved slot states on disk.", len(store.states))
        yield GaugeMetricFamily(
            "mrunner_prompt_cache_bytes", "Bytes of saved slot states on disk.", store.bytes
        )
