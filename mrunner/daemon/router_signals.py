"""The load signals cluster routers read, under vLLM's names, from mrunner's queue and its runners' slots.

The Gateway API Inference Extension's endpoint picker (llm-d, Envoy AI
Gateway), vLLM's production-stack router and others pick a node by its queue,
its running requests and its KV-cache use, read from C{/metrics} under vLLM's
names by default (the extension's "model server protocol"):

  - C{vllm:num_requests_waiting}: requests mrunner has queued for a runner;
  - C{vllm:num_requests_running}: requests runners serve now (leases held);
  - C{vllm:kv_cache_usage_perc}: from 0 to 1, the tokens the busy slots of the
    ready runners hold over the context those runners have, from each
    llama-server's C{GET /slots} (the pinned build no longer exports a KV ratio);
  - C{vllm:lora_requests_info}: the protocol's adapter-affinity signal, read as
    "which models are resident": C{running_lora_adapters} names the models
    loaded here, C{waiting_lora_adapters} those loading, C{max_lora} is
    C{[scheduler] max_runners}; the value is the time of the scrape.

C{/slots} is read with C{/metrics}, only when C{/metrics} is, in parallel and
within the same bound: a request never waits for it.

A scrape that C{[cluster] open_metrics} lets in without a key sees these signals
alone (L{load_signals}), with mrunner's own queue and runner gauges: never a key's
name or counts (a normal key sees its own too), nor the models a node has merely served or failed to load.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime

from mrunner.runners.checks import Get
from mrunner.runners.metrics import SCRAPED_STATES, Families, RunnerScraper
from mrunner.teams.key_metrics import KEY_FAMILIES
from mrunner.values import RunnerSnapshot, State

#: Tokens held and tokens of room, of one runner.
KV = tuple[int, int]
#: The families a router reads: the queue, the requests running, KV-cache use, the models resident.
LOAD_SIGNALS = frozenset(
    {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
        "mrunner_queue_waiting",
        "mrunner_runners",
        "mrunner_runner_requests_in_flight",
    }
)


def load_signals(*sources: Collector | Families, key: str | None = None) -> Families:
    """Only the L{LOAD_SIGNALS} of C{sources}: what a scrape without a key sees.

    With C{key}, a normal key's name, also that key's own samples of the per-key
    families: what it sees, as C{/usage} shows it only its own rows.
    """
    found = Families()
    for source in sources:
        for family in source.collect():
            if family.name in LOAD_SIGNALS:
                found.add([family])
            elif key is not None and family.name in KEY_FAMILIES:
                found.add([_of_key(family, key)])
    return found


def _of_key(family: Metric, key: str) -> Metric:
    """C{family} with only the samples labelled C{key}."""
    own = Metric(family.name, family.documentation, family.type, family.unit)
    own.samples = [sample for sample in family.samples if sample.labels.get("key") == key]
    return own


def kv_tokens(slots: object) -> KV:
    """From llama-server's C{/slots} answer: the tokens its busy slots hold, and its context.

    A runner's slots share one KV pool (C{--kv-unified}) of a whole context each
    (C{--kv-unified-per-slot}, each slot's C{n_ctx}): the room is their sum. An
    idle slot's cached prompt is free to reuse and does not count, as vLLM counts
    only running requests' blocks.
    """
    if not isinstance(slots, list):
        return 0, 0
    held, room = 0, 0
    for slot in slots:
        if not isinstance(slot, dict):
            continue
        room += _count(slot.get("n_ctx"))
        if slot.get("is_processing"):
            steps = slot.get("next_token") or [{}]
            decoded = _count(steps[0].get("n_decoded")) if isinstance(steps[0], dict) else 0
            held += _count(slot.get("n_prompt_tokens")) + decoded
    return min(held, room), room


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def resident_names(name: str) -> list[str]:
    """The names a request may use for the model C{name}: C{ai/x:latest} is also asked for as C{ai/x}."""
    return [name, name.removesuffix(":latest")] if name.endswith(":latest") else [name]


def router_families(
    runners: Sequence[RunnerSnapshot], queued: int, kv: Iterable[KV], max_runners: int, now: float
) -> Iterator[Metric]:
    """The signals under vLLM's names, from the scheduler's state and each ready runner's KV tokens."""
    waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests queued for a runner.")
    waiting.add_metric([], queued)
    running = GaugeMetricFamily("vllm:num_requests_running", "Requests the runners are serving now.")
    running.add_metric([], sum(runner.in_use for runner in runners))
    kv = list(kv)
    held, room = sum(tokens for tokens, _ in kv), sum(context for _, context in kv)
    usage = GaugeMetricFamily(
        "vllm:kv_cache_usage_perc", "KV-cache use of the ready runners, 0 to 1: busy slots' tokens / context."
    )
    usage.add_metric([], held / room if room else 0.0)
    loaded = [r for r in runners if r.state in (State.READY, State.DRAINING)]
    loading = [r for r in runners if r.state is State.LOADING]
    info = GaugeMetricFamily(
        "vllm:lora_requests_info",
        "Models loaded here (running_lora_adapters) and loading (waiting_lora_adapters); value: the time.",
        labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
    )
    info.add_metric([_names(loaded), _names(loading), str(max_runners)], now)
    yield from (waiting, running, usage, info)


def _names(runners: Iterable[RunnerSnapshot]) -> str:
    names = dict.fromkeys(name for runner in runners for name in resident_names(runner.model_name))
    return ",".join(names)


class RouterSignals(RunnerScraper):
    """The runners' own metrics (L{RunnerScraper}), and the router signals computed beside them."""

    def __init__(
        self,
        get: Get,
        clock: IReactorTime,
        queued: Callable[[], int],
        max_runners: Callable[[], int],
    ):
        super().__init__(get, clock)
        self._queued = queued
        self._max_runners = max_runners

    def scrape(self, runners: Iterable[RunnerSnapshot]) -> Deferred[Families]:
        return Deferred.fromCoroutine(self._scrape(list(runners)))

    async def _scrape(self, runners: list[RunnerSnapshot]) -> Families:
        asked = [runner for runner in runners if runner.state in SCRAPED_STATES]
        slots = DeferredList([self._slots(runner) for runner in asked], consumeErrors=True)
        families = await super().scrape(runners)
        kv = [value for ok, value in await slots if ok]
        families.add(router_families(runners, self._queued(), kv, self._max_runners(), self._clock.seconds()))
        return families

    def _slots(self, runner: RunnerSnapshot) -> Deferred[KV]:
        d = Deferred.fromCoroutine(self._read_slots(runner))
        d.addTimeout(self._seconds, self._clock)
        return d

    async def _read_slots(self, runner: RunnerSnapshot) -> KV:
        code, body = await self._get(runner.socket, b"/slots")
        return kv_tokens(json.loads(body)) if code == 200 else (0, 0)
