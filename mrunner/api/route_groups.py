"""The daemon's route groups in the order L{Routes} tries them: one list for C{tap.py} and the tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from mrunner.api.compat.anthropic.routes import AnthropicAPI
from mrunner.api.compat.ollama.models import OllamaModelsAPI
from mrunner.api.compat.ollama.routes import OllamaAPI
from mrunner.api.compat.responses.response_store import ResponseStore
from mrunner.api.compat.responses.routes import ResponsesAPI
from mrunner.api.door.route_group import RouteGroup
from mrunner.api.manage.admin import AdminAPI
from mrunner.api.manage.devices import DevicesAPI
from mrunner.api.manage.model_operations import ModelOperations
from mrunner.api.manage.models import ModelsAPI
from mrunner.api.manage.openapi import OpenAPI
from mrunner.api.manage.prompt_cache import PromptCacheAPI, SavedStates
from mrunner.api.manage.status import StatusAPI
from mrunner.api.observe.logs import LogsAPI
from mrunner.api.observe.page import PageAPI
from mrunner.api.observe.records_api import RecordsAPI
from mrunner.api.observe.usage_api import UsageAPI
from mrunner.api.openai.audio import AudioAPI
from mrunner.api.openai.gateway import Gateway
from mrunner.api.openai.routes import InferenceAPI
from mrunner.interfaces import IBackend, IDevices, IModelStoreAdmin
from mrunner.proxy.forwarder import Forwarder
from mrunner.runners.metrics import RunnerScraper
from mrunner.teams.usage import UsageBook


def route_groups(
    *,
    gateway: Gateway,
    store: IModelStoreAdmin,
    forwarder: Forwarder,
    responses: ResponseStore,
    models: ModelsAPI,
    operations: ModelOperations,
    metrics: CollectorRegistry,
    scraper: RunnerScraper,
    logs: LogsAPI,
    history: RecordsAPI,
    backends: Mapping[str, IBackend],
    max_request_bytes: int,
    reload: Callable[[], dict[str, Any]] | None = None,
    devices: IDevices | None = None,
    usage: UsageBook | None = None,
    docker_config: str | None = None,
    cache: SavedStates | None = None,
    cache_counts: Mapping[str, Any] | None = None,
) -> list[RouteGroup]:
    """Every route group of the daemon, the OpenAPI document of them all last.

    The inference routes come first: every token's request is matched against them.
    Ollama's model routes come after its generation routes, whose paths their catch-all
    would otherwise answer.
    """
    scheduler, clock = gateway.scheduler, gateway.clock
    groups: list[RouteGroup] = [
        InferenceAPI(gateway, store, forwarder),
        AudioAPI(gateway, forwarder),
        AnthropicAPI(gateway, forwarder),
        ResponsesAPI(gateway, forwarder, responses, store),
        OllamaAPI(gateway, forwarder, store),
        OllamaModelsAPI(store, operations, scheduler, gateway.aliases),
        StatusAPI(models, metrics, scheduler, scraper, docker_config),
        logs,
        history,
        PageAPI(scheduler, clock, store, cache_counts),
        AdminAPI(scheduler, store, backends, max_request_bytes, reload, cache.usage if cache else None),
        UsageAPI(usage),
    ]
    if devices is not None:
        groups.append(DevicesAPI(devices))
    if cache is not None:
        groups.append(PromptCacheAPI(cache))
    return [*groups, OpenAPI(groups)]
