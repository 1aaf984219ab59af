"""Each ready runner's own Prometheus metrics (llama-server's ``--metrics``), read when C{/metrics} is.

Runners are asked at once, each over its UNIX socket, and whatever has not
answered within L{SCRAPE_SECONDS} is left out: a slow or dead runner never
holds up the daemon's answer. Every sample gets the runner's C{backend},
C{model} and C{mode} labels, and names are made valid for Prometheus without
a recording rule's colon (C{llamacpp:prompt_tokens_total} becomes
C{llamacpp_prompt_tokens_total}).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from mrunner.runners.checks import Get
from mrunner.values import RunnerSnapshot, State

SCRAPE_SECONDS = 1.0
SCRAPED_STATES = (State.READY, State.DRAINING)
_INVALID = re.compile(r"[^a-zA-Z0-9_]")

log = Logger()


def metric_name(name: str) -> str:
    """C{name} with every character Prometheus does not allow in a plain name made C{_}."""
    name = _INVALID.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


def relabel(families: Iterable[Metric], runner: RunnerSnapshot) -> Iterator[Metric]:
    """C{families} renamed, each sample with the runner's labels added."""
    extra = {"backend": runner.backend, "model": runner.model_name, "mode": runner.mode}
    for family in families:
        renamed = Metric(metric_name(family.name), family.documentation, family.type, family.unit)
        for sample in family.samples:
            renamed.add_sample(metric_name(sample.name), {**sample.labels, **extra}, sample.value)
        yield renamed


class Families:
    """Metric families merged by name (one HELP and TYPE each), as a collector C{generate_latest} takes."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, families: Iterable[Metric]) -> None:
        for family in families:
            known = self._families.setdefault(family.name, family)
            if known is not family and known.type == family.type:
                known.samples.extend(family.samples)

    def collect(self) -> Iterator[Metric]:
        yield from self._families.values()


class RunnerScraper:
    """Reads C{GET /metrics} from runners through C{get}, in parallel, within L{SCRAPE_SECONDS}."""

    def __init__(self, get: Get, clock: IReactorTime, seconds: float = SCRAPE_SECONDS):
        self._get = get
        self._clock = clock
        self._seconds = seconds

    def scrape(self, runners: Iterable[RunnerSnapshot]) -> Deferred[Families]:
        """The metrics of every runner in C{runners} that is ready and answers in time."""
        asked = [runner for runner in runners if runner.state in SCRAPED_STATES]
        return DeferredList([self._one(runner) for runner in asked], consumeErrors=True).addCallback(
            _merged, asked
        )

    def _one(self, runner: RunnerSnapshot) -> Deferred[list[Metric]]:
        d = Deferred.fromCoroutine(self._read(runner))
        d.addTimeout(self._seconds, self._clock)
        return d

    async def _read(self, runner: RunnerSnapshot) -> list[Metric]:
        code, body = await self._get(runner.socket, b"/metrics")
        if code != 200:
            return []  # a backend without metrics
        return list(relabel(text_string_to_metric_families(body.decode("utf-8", errors="replace")), runner))


def _merged(results: list[tuple[bool, Any]], runners: list[RunnerSnapshot]) -> Families:
    families = Families()
    for (ok, value), runner in zip(results, runners, strict=True):
        if ok:
            families.add(value)
        else:
            log.debug("runner {model} skipped in /metrics: {why}", model=runner.model_name, why=value)
    return families


Scrape = Callable[[Iterable[RunnerSnapshot]], Deferred[Families]]
