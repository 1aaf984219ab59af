"""Prometheus metrics: the scheduler's state read at scrape time, what happened to runners, request counts.

C{GET /metrics} adds each ready runner's own metrics (L{mrunner.runners.metrics}).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from zope.interface import implementer

from mrunner.interfaces import ILoaderEvents, IScheduler
from mrunner.values import RunnerKey

RUNNER_LABELS = ["backend", "model", "mode"]
# From a request that finds its runner ready (well under a millisecond) to one that waits minutes.
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
#: Seconds a transcription took per second of its audio (under 1: faster than real time).
FACTOR_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)


class SchedulerCollector(Collector):
    """Runners by state, their memory against the budget, and the wait queue, as they are at scrape time."""

    def __init__(self, scheduler: IScheduler):
        self._scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runners = GaugeMetricFamily(
            "mrunner_runners", "Runner processes by model, mode and state.", labels=[*RUNNER_LABELS, "state"]
        )
        in_use = GaugeMetricFamily(
            "mrunner_runner_requests_in_flight", "Requests a runner is serving.", labels=RUNNER_LABELS
        )
        memory = GaugeMetricFamily(
            "mrunner_runner_memory_bytes",
            "What the budget counts for a runner: its estimate, or its measured memory once larger.",
            labels=RUNNER_LABELS,
        )
        estimate = GaugeMetricFamily(
            "mrunner_runner_memory_estimate_bytes",
            "A runner's memory need as estimated from its model's GGUF before it started.",
            labels=RUNNER_LABELS,
        )
        measured = GaugeMetricFamily(
            "mrunner_runner_memory_measured_bytes",
            "A runner process's resident memory, read from /proc.",
            labels=RUNNER_LABELS,
        )
        # Summed per label set: a model's instances ([models] instances) share their labels.
        sums: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
        for runner in self._scheduler.snapshot():
            labels: tuple[str, ...] = (runner.backend, runner.model_name, runner.mode)
            sums[runners.name, (*labels, runner.state.value)] += 1
            sums[in_use.name, labels] += runner.in_use
            sums[memory.name, labels] += runner.memory
            sums[estimate.name, labels] += runner.memory_estimate
            if runner.memory_measured is not None:
                sums[measured.name, labels] += runner.memory_measured
        families = {family.name: family for family in (runners, in_use, memory, estimate, measured)}
        for (name, labels), value in sums.items():
            families[name].add_metric(list(labels), value)
        queue = GaugeMetricFamily("mrunner_queue_waiting", "Requests waiting for a runner.")
        queue.add_metric([], self._scheduler.queued())
        budget = GaugeMetricFamily(
            "mrunner_memory_budget_bytes", "Memory the runners may use together; 0 means no budget."
        )
        budget.add_metric([], self._scheduler.memory_budget())
        yield from (runners, in_use, memory, estimate, measured, queue, budget)
        yield from self._queues()

    def _queues(self) -> Iterator[GaugeMetricFamily]:
        """The queue model by model: how many wait, and how long the oldest has."""
        length = GaugeMetricFamily(
            "mrunner_model_queue_waiting", "Requests waiting for a model's runner.", labels=RUNNER_LABELS
        )
        oldest = GaugeMetricFamily(
            "mrunner_model_queue_oldest_wait_seconds",
            "How long the oldest request waiting for a model's runner has waited.",
            labels=RUNNER_LABELS,
        )
        for waiting in self._scheduler.waiting():
            labels = [waiting.backend, waiting.model_name, waiting.mode]
            length.add_metric(labels, waiting.count)
            oldest.add_metric(labels, waiting.oldest_seconds)
        yield from (length, oldest)


@implementer(ILoaderEvents)
class Metrics:
    """One registry per daemon, so tests and several daemons never share counters.

    As the loader's L{ILoaderEvents} it counts loads, evictions and exits;
    L{watch} adds the scheduler's state, read at scrape time.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "mrunner_requests",
            "Inference requests by mode and HTTP status.",
            ["mode", "status"],
            registry=registry,
        )
        self.seconds = Histogram(
            "mrunner_request_seconds",
            "Time from request to the end of the answer.",
            ["mode"],
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.queue_wait = Histogram(
            "mrunner_queue_wait_seconds",
            "Time a request waited for a runner slot, loading included.",
            ["model"],
            registry=registry,
            buckets=WAIT_BUCKETS,
        )
        self.load_seconds = Histogram(
            "mrunner_load_seconds",
            "Time from starting a runner to its first healthy answer.",
            ["model"],
            registry=registry,
            buckets=LOAD_BUCKETS,
        )
        self.load_failures = Counter(
            "mrunner_load_failures",
            "Runners that could not start or never became ready.",
            RUNNER_LABELS,
            registry=registry,
        )
        self.evictions = Counter(
            "mrunner_evictions",
            "Runners told to go, by reason: idle (keep-alive), memory (room for another), unload, crash.",
            [*RUNNER_LABELS, "reason"],
            registry=registry,
        )
        self.exits = Counter(
            "mrunner_runner_exits",
            "Runner processes that ended, by cause: stopped (asked to), crashed, failed (while loading).",
            [*RUNNER_LABELS, "cause"],
            registry=registry,
        )
        self.audio, self.real_time = _speech(registry)
        self.pulled = Counter("mrunner_pulled_bytes", "Bytes downloaded from registries.", registry=registry)
        self.pushed = Counter("mrunner_pushed_bytes", "Bytes uploaded to registries.", registry=registry)
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._waits: dict[str, Any] = {}

    def watch(self, scheduler: IScheduler) -> None:
        """Report C{scheduler}'s runners, queue and budget at each scrape."""
        self.registry.register(SchedulerCollector(scheduler))

    def finished(self, mode: str, status: int, seconds: float) -> None:
        """Count a request that ended with C{status} after C{seconds}.

        The labelled children are kept: looking them up in prometheus_client
        (a lock, label checks) took 3% of the daemon's CPU on small chats.
        """
        children = self._children.get((mode, status))
        if children is None:
            children = self._children[(mode, status)] = (
                self.requests.labels(mode, str(status)),
                self.seconds.labels(mode),
            )
        children[0].inc()
        children[1].observe(seconds)

    def waited(self, model: str, seconds: float) -> None:
        """A request for C{model} got a runner slot C{seconds} after it arrived (children kept, as above)."""
        child = self._waits.get(model)
        if child is None:
            child = self._waits[model] = self.queue_wait.labels(model)
        child.observe(seconds)

    def transcribed(self, model: str, audio: float, seconds: float) -> None:
        """C{model} turned C{audio} seconds of speech into text in C{seconds}."""
        self.audio.labels(model).inc(audio)
        self.real_time.labels(model).observe(seconds / audio)

    def moved(self, mode: str, count: int) -> None:
        """A pull or push (C{mode}) moved C{count} bytes."""
        (self.pulled if mode == "pull" else self.pushed).inc(count)

    def loaded(self, key: RunnerKey, model: str, seconds: float) -> None:
        self.load_seconds.labels(model).observe(seconds)

    def load_failed(self, key: RunnerKey, model: str) -> None:
        self.load_failures.labels(key.backend, model, key.mode).inc()

    def evicted(self, key: RunnerKey, model: str, reason: str) -> None:
        self.evictions.labels(key.backend, model, key.mode, reason).inc()

    def exited(self, key: RunnerKey, model: str, cause: str) -> None:
        self.exits.labels(key.backend, model, key.mode, cause).inc()


def _speech(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    """The audio routes' counts: seconds of audio, and the real-time factor, by model."""
    audio = Counter(
        "mrunner_audio_seconds", "Seconds of audio transcribed or translated.", ["model"], registry=registry
    )
    real_time = Histogram(
        "mrunner_real_time_factor",
        "A transcription's seconds, waiting for its runner excluded, per second of its audio.",
        ["model"],
        registry=registry,
        buckets=FACTOR_BUCKETS,
    )
    return audio, real_time
