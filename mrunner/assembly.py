"""How each of the daemon's parts is built from the configuration; L{mrunner.tap.make_parts} wires
them together, in the order they need each other."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from treq.client import HTTPClient
from twisted.web.client import Agent

from mrunner import config as configuration
from mrunner.api.aliases import Aliases
from mrunner.api.compat.responses.response_store import ResponseStore
from mrunner.api.door.callers import caller
from mrunner.api.errors import openai_stream_error
from mrunner.api.manage.model_operations import ModelOperations
from mrunner.api.observe.follow import Followers
from mrunner.api.observe.logs import LogsAPI
from mrunner.api.observe.records import Records, cache_source
from mrunner.api.openai.gateway import Gateway
from mrunner.backends.command import CommandBackend
from mrunner.backends.llamacpp import LlamaCppBackend
from mrunner.backends.whispercpp import WhisperCppBackend
from mrunner.cache.metrics import CacheCollector
from mrunner.cache.opening import prompt_cache
from mrunner.cache.turns import PromptCache
from mrunner.daemon.metrics import Metrics
from mrunner.daemon.reload import Reconfigure
from mrunner.daemon.router_signals import RouterSignals
from mrunner.daemon.startup import StartupError
from mrunner.devices.inventory import Devices, used_by_runners
from mrunner.devices.metrics import DeviceCollector
from mrunner.devices.nvml import Nvml
from mrunner.home import Home
from mrunner.interfaces import IBackend
from mrunner.proxy.cmover import fast_relay
from mrunner.proxy.forwarder import Forwarder, as_sent
from mrunner.proxy.pool import RunnerPool
from mrunner.runners.checks import RunnerChecks
from mrunner.runners.metrics import RunnerScraper
from mrunner.runners.process import RunnerOptions, new_process
from mrunner.scheduling.facade import Scheduler
from mrunner.scheduling.spawning import StartRunner
from mrunner.store.clientpool import QuietPool
from mrunner.store.credentials import Credentials
from mrunner.store.errors import StoreCorrupt
from mrunner.store.huggingface import HubClient
from mrunner.store.local import ModelStore
from mrunner.store.pull import Puller
from mrunner.store.push import Pusher
from mrunner.store.registry import RegistryClient
from mrunner.teams.admission import Teams
from mrunner.teams.key_metrics import KeyMetrics
from mrunner.teams.usage import UsageBook, UsageCollector


def make_backends(config: configuration.Config, reactor: Any) -> dict[str, IBackend]:
    """llama.cpp and whisper.cpp, plus every ``[backends.NAME]`` table that gives a ``command``."""
    backends: dict[str, IBackend] = {
        "llama.cpp": LlamaCppBackend(config, reactor),
        "whisper.cpp": WhisperCppBackend(config, reactor),
    }
    for name, table in config.backends.items():
        if "command" in table:
            backends[name] = CommandBackend(name, table["command"], table.get("env"))
    return backends


def make_forwarder(
    config: configuration.Config, reactor: Any, pool: RunnerPool, cache: PromptCache | None
) -> Forwarder:
    """The one forwarder: the prompt cache's turns where it is on, the fast relay's thread unless
    C{[http] relay = "twisted"}."""
    fast = fast_relay(reactor, config.http.relay)
    return Forwarder(pool, openai_stream_error, cache.turn if cache else as_sent, fast=fast)


def make_responses(config: configuration.Config, reactor: Any) -> ResponseStore:
    """The Responses API's stored responses, in memory."""
    settings = config.responses
    return ResponseStore(reactor, settings.ttl, settings.max_count, settings.max_bytes)


def make_store(config: configuration.Config, reactor: Any) -> ModelStore:
    """The home's model store; an index it may not read, or cannot move aside to rebuild, stops the start."""
    try:
        return ModelStore(config.home, reactor, config.store.partial_max_age)
    except StoreCorrupt as e:
        raise StartupError(e.message) from None


def make_follows(
    config: configuration.Config, reactor: Any, home: Home, reloadable: list[Reconfigure]
) -> tuple[Followers, LogsAPI]:
    """/logs and /engines/requests follows, under one cap (reloadable), and the logs' API."""
    followers = Followers(config)
    reloadable.append(followers.configure)
    return followers, LogsAPI(home.logs, reactor, followers)


def make_scraper(
    config: configuration.Config, reactor: Any, checks: RunnerChecks, scheduler: Scheduler
) -> Any:
    """What /metrics reads from the runners: under vLLM's names for a cluster's router, else as they are."""
    if config.cluster.metric_names:
        return RouterSignals(checks.get, reactor, scheduler.queued, scheduler.max_runners)
    return RunnerScraper(checks.get, reactor)


def _runner_options(config: configuration.Config) -> RunnerOptions:
    return RunnerOptions(
        load_timeout=config.scheduler.load_timeout,
        stop_grace=config.scheduler.stop_grace,
        log_max_bytes=config.runner.log_max_bytes,
        log_keep=config.runner.log_keep,
    )


def cache_parts(cache: PromptCache | None, scheduler: Scheduler) -> dict[str, Any]:
    """The route groups' part the prompt cache adds, its states' routes and the page's counts; and the
    loader's choice of instance (the one whose slot holds a conversation's earlier turn)."""
    if cache is None:
        return {}
    scheduler.loader.prefer = cache.prefer
    return {"cache": cache.store, "cache_counts": cache.by_model}


def make_runners(
    config: configuration.Config, reactor: Any, pool: RunnerPool, checks: RunnerChecks, metrics: Metrics
) -> tuple[PromptCache | None, StartRunner]:
    """The prompt cache, if on, and how a runner's process is started: its slots saved by the prompt
    cache before a planned stop when there is one."""
    cache = prompt_cache(config, reactor, pool, lambda request: caller(request).owner, cache_source)
    if cache is not None:
        metrics.registry.register(CacheCollector(cache))
    start: StartRunner = partial(new_process, reactor, checks.healthy, _runner_options(config))
    return cache, start if cache is None else cache.start_runner(start)


def make_scheduling(
    config: configuration.Config,
    reactor: Any,
    backends: dict[str, IBackend],
    store: ModelStore,
    home: Home,
    start_runner: StartRunner,
    metrics: Metrics,
    pull: Callable[[str], Awaitable[object]],
) -> tuple[Scheduler, Devices]:
    """The scheduler and the devices it fits runners on, both watched by C{metrics}."""
    llamacpp = backends["llama.cpp"]
    assert isinstance(llamacpp, LlamaCppBackend)
    # The devices and the scheduler ask each other: the RAM's budget and what runners hold.
    devices = Devices(
        llamacpp,
        config.gpu,
        lambda: scheduler.memory_budget(),
        lambda: used_by_runners(scheduler.snapshot()),
        Nvml.load(),
        now=reactor.seconds,
    )
    scheduler = Scheduler(
        reactor,
        config,
        backends,
        store,
        start_runner,
        home,
        events=metrics,
        devices=devices,
        pull=pull,
    )
    metrics.watch(scheduler)
    metrics.registry.register(DeviceCollector(devices))
    return scheduler, devices


def make_operations(
    config: configuration.Config,
    reactor: Any,
    store: ModelStore,
    scheduler: Scheduler,
    metrics: Metrics,
    pool: QuietPool,
    credentials: Credentials,
    cache: PromptCache | None,
) -> ModelOperations:
    """Pulls and pushes, from the registries and Hugging Face, over C{pool}; the saved prompt states of
    a model removed go with it."""
    http = HTTPClient(Agent(reactor, pool=pool))
    registry = RegistryClient(config.registry, reactor, http, config.store.read_timeout, credentials)
    hub = HubClient(config.huggingface, http, os.environ, reactor, config.store.read_timeout)
    return ModelOperations(
        store,
        scheduler,
        Puller(store, registry, config.registry.max_pulls, hub=hub, read_timeout=config.store.read_timeout),
        Pusher(store, registry, reactor),
        reactor,
        metrics.moved,
        cache.store.sweep if cache else lambda: None,
    )


def make_gateway(
    config: configuration.Config,
    reactor: Any,
    store: ModelStore,
    scheduler: Scheduler,
    metrics: Metrics,
    reloadable: list[Reconfigure],
) -> tuple[Gateway, Records | None, Teams]:
    """The gateway with what it keeps per request: records, aliases, named keys' usage (reloadable)."""
    records = (
        Records(config.records.per_model, config.records.max_bytes, config.records.max_body, reactor.seconds)
        if config.records.enabled
        else None
    )
    aliases = Aliases(config.aliases, store)
    reloadable.append(aliases.configure)
    usage_book = UsageBook(config.home, reactor, reactor.seconds, store.resolve, keeping=bool(config.keys))
    reloadable.append(usage_book.configure)
    metrics.registry.register(UsageCollector(usage_book))
    teams = Teams(reactor.seconds, usage_book, KeyMetrics(metrics.registry))
    gateway = Gateway(
        scheduler, store, metrics, reactor, config.max_request_bytes, records, aliases=aliases, teams=teams
    )
    return gateway, records, teams
