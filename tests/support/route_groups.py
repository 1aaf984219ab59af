"""The daemon's route groups (L{route_groups}, as C{tap.py} builds them) over a test's scheduler and store.

What no unit test reaches is a stand-in: runners are unreachable, and pulls and pushes refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime

from mrunner.api.compat.responses.response_store import ResponseStore
from mrunner.api.door.route_group import RouteGroup
from mrunner.api.errors import openai_stream_error
from mrunner.api.manage.model_operations import ModelOperations
from mrunner.api.manage.models import ModelsAPI
from mrunner.api.observe.logs import LogsAPI
from mrunner.api.observe.records import Records
from mrunner.api.observe.records_api import RecordsAPI
from mrunner.api.openai.gateway import Gateway
from mrunner.api.route_groups import route_groups
from mrunner.config import Config
from mrunner.daemon.metrics import Metrics
from mrunner.devices.inventory import Devices
from mrunner.devices.listing import Listed
from mrunner.interfaces import IBackend
from mrunner.proxy.forwarder import Forwarder
from mrunner.runners.metrics import RunnerScraper
from tests.support.fakes import unreachable_runners


class NoGPUs:
    """A llama.cpp build that lists no GPU: the devices of a CPU machine."""

    variant = "cpu"

    def listed(self) -> list[Listed]:
        return []

    def list_devices(self) -> Deferred[list[Listed]]:
        return succeed([])


def daemon_groups(
    scheduler: Any,
    store: Any,
    clock: IReactorTime,
    backends: Mapping[str, IBackend],
    logs: Path,
    max_request_bytes: int = 1000,
    metrics: Metrics | None = None,
    records: Records | None = None,
    cache_counts: Mapping[str, Any] | None = None,
) -> list[RouteGroup]:
    """Every route group, over C{scheduler} and C{store}; C{logs} is the runners' log directory;
    C{cache_counts}, the prompt cache's counts by model, as the page shows them."""
    metrics = Metrics() if metrics is None else metrics
    gateway = Gateway(scheduler, store, metrics, clock, max_request_bytes, records)
    operations = ModelOperations(store, scheduler, None, None, clock, metrics.moved)  # type: ignore[arg-type]
    responses = Config().responses
    return route_groups(
        gateway=gateway,
        store=store,
        forwarder=Forwarder(None, openai_stream_error),  # type: ignore[arg-type]
        responses=ResponseStore(clock, responses.ttl, responses.max_count, responses.max_bytes),
        models=ModelsAPI(store, operations),
        operations=operations,
        metrics=metrics.registry,
        scraper=RunnerScraper(unreachable_runners, clock),
        logs=LogsAPI(logs, clock),
        history=RecordsAPI(records),
        backends=backends,
        max_request_bytes=max_request_bytes,
        devices=Devices(NoGPUs(), Config().gpu, scheduler.memory_budget),
        cache_counts=cache_counts,
    )
