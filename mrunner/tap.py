"""``twistd mrunner``: command-line options and the service tree. The one place that wires parts."""

from __future__ import annotations

# First: the imports below load Twisted without pyOpenSSL, until TLS is used (see lazytls).
import mrunner.daemon.lazytls  # isort: skip

import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import attrs
from treq.client import HTTPClient
from twisted.application.service import IService, MultiService
from twisted.logger import Logger
from twisted.python import usage
from twisted.web.client import Agent

from mrunner import config as configuration
from mrunner.api.aliases import Aliases
from mrunner.api.compat.responses.response_store import ResponseStore
from mrunner.api.door import declared
from mrunner.api.door.callers import caller
from mrunner.api.door.routing import Routes
from mrunner.api.door.site import GatedSite, private_listen
from mrunner.api.errors import openai_stream_error
from mrunner.api.manage.model_operations import ModelOperations
from mrunner.api.manage.models import ModelsAPI
from mrunner.api.observe.follow import Followers
from mrunner.api.observe.logs import LogsAPI
from mrunner.api.observe.records import Records, cache_source
from mrunner.api.observe.records_api import RecordsAPI
from mrunner.api.openai.gateway import Gateway
from mrunner.api.route_groups import route_groups
from mrunner.backends.command import CommandBackend
from mrunner.backends.llamacpp import LlamaCppBackend
from mrunner.backends.whispercpp import WhisperCppBackend
from mrunner.cache.metrics import CacheCollector
from mrunner.cache.opening import prompt_cache
from mrunner.cache.turns import PromptCache
from mrunner.daemon import collector
from mrunner.daemon.listening import AddressFile, uses_tls
from mrunner.daemon.logfiles import DaemonLogFile
from mrunner.daemon.metrics import Metrics
from mrunner.daemon.reload import Reconfigure, Reloader, ReloadOnHangup
from mrunner.daemon.router_signals import RouterSignals
from mrunner.daemon.startup import HomeLock, Listener, StartupError, check_listen, daemon_process
from mrunner.devices.inventory import Devices, used_by_runners
from mrunner.devices.metrics import DeviceCollector
from mrunner.devices.nvml import Nvml
from mrunner.home import PRIVATE_UMASK, Home
from mrunner.interfaces import IBackend
from mrunner.runners.checks import RunnerChecks
from mrunner.runners.cmover import fast_relay
from mrunner.runners.forwarder import Forwarder, as_sent
from mrunner.runners.metrics import RunnerScraper
from mrunner.runners.pool import RunnerPool, unix_connect
from mrunner.runners.process import RunnerOptions, new_process
from mrunner.scheduling.facade import Scheduler
from mrunner.scheduling.service import SchedulerService
from mrunner.scheduling.spawning import StartRunner
from mrunner.store.clientpool import QuietPool
from mrunner.store.credentials import Credentials
from mrunner.store.errors import StoreCorrupt
from mrunner.store.huggingface import HubClient
from mrunner.store.local import ModelStore
from mrunner.store.names import parse
from mrunner.store.pull import Puller
from mrunner.store.push import Pusher
from mrunner.store.registry import RegistryClient
from mrunner.store.sources.catalog import Sources
from mrunner.teams.admission import Teams
from mrunner.teams.key_metrics import KeyMetrics
from mrunner.teams.usage import UsageBook, UsageCollector, UsageService

log = Logger()
TWISTD_PIDFILE = "twistd.pid"  # twistd's default --pidfile


class Options(usage.Options):
    """``twistd mrunner [--config FILE] [--listen ENDPOINT] [--home DIR]``."""

    optParameters = [
        ["config", "c", None, "TOML config file [default: ./tap.conf, else the home's tap.conf]"],
        ["listen", "l", None, "endpoint; over $MRUNNER_LISTEN [default: tcp:12434:interface=127.0.0.1]"],
        ["home", None, None, "models, backends, run, logs; over $MRUNNER_HOME [default: ~/.mrunner]"],
    ]

    def postOptions(self) -> None:
        """Read the configuration; a mistake in it ends the start with one line, not twistd's usage text.

        twistd's default C{--pidfile} (C{twistd.pid} in the current folder) is dropped: the
        home's lock already names the daemon's pid, and says so to a second daemon.
        """
        daemon_process()
        server = getattr(self, "parent", None)
        if server is not None and server.get("pidfile") == TWISTD_PIDFILE:
            server["pidfile"] = ""
        try:
            self.config = self.read_config()
        except configuration.ConfigError as e:
            raise StartupError(str(e)) from None
        if uses_tls(self.config.listen):
            mrunner.daemon.lazytls.arm()
        check_listen(self.config.listen)

    def read_config(self) -> configuration.Config:
        """The configuration as the file says now, with these options over it (again on reload)."""
        return configuration.load(self["config"], overrides={"listen": self["listen"], "home": self["home"]})


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


@attrs.frozen
class Parts:
    """The wired daemon: its HTTP server and the long-lived objects behind it.

    C{site.configure(config)} replaces the front-door rules (C{[http]}) at run time.
    """

    site: GatedSite
    scheduler: Scheduler
    logs: LogsAPI
    history: RecordsAPI
    closers: tuple[Callable[[], object], ...]
    reloader: Reloader
    teams: Teams
    forwarder: Forwarder


def _forwarder(
    config: configuration.Config, reactor: Any, pool: RunnerPool, cache: PromptCache | None
) -> Forwarder:
    """The one forwarder: the prompt cache's turns where it is on, the fast relay's thread unless
    C{[http] relay = "twisted"}."""
    fast = fast_relay(reactor, config.http.relay)
    return Forwarder(pool, openai_stream_error, cache.turn if cache else as_sent, fast=fast)


def make_parts(
    config: configuration.Config, reactor: Any, read_config: Callable[[], configuration.Config] | None = None
) -> Parts:
    """Build every part of the daemon from C{config}; C{read_config} reads it again for a reload."""
    home = Home(config.home)
    backends = make_backends(config, reactor)
    store = _store(config, reactor)
    runner_pool = RunnerPool(reactor, unix_connect(reactor), max(config.scheduler.parallel, 2))
    metrics = Metrics()
    # Health checks and /metrics scrapes: a new runner connection each, none kept (the pool is for requests).
    checks = RunnerChecks(runner_pool)

    # A preload missing from the store is pulled (operations is built below, before any start).
    def pull(name: str) -> Awaitable[object]:
        return operations.pull(parse(name), operations.progress(lambda line: None, "pull"))

    cache, start_runner = _runners(config, reactor, runner_pool, checks, metrics)
    scheduler, devices = _scheduling(config, reactor, backends, store, home, start_runner, metrics, pull)
    # What a reload hands the new configuration to, in order. The Reloader holds this list:
    # a part built further down (the front door's trust settings) is appended to it.
    reloadable: list[Reconfigure] = [scheduler.reconfigure, *([cache.configure] if cache else [])]
    reloader = Reloader(read_config or (lambda: config), config, reloadable)
    registry_pool = QuietPool(reactor)
    # Docker's config and credential helpers, after [registry.auth]; helpers see the daemon's environment.
    credentials = Credentials(config.registry.auth, reactor, os.environ)
    operations = _operations(config, reactor, store, scheduler, metrics, registry_pool, credentials, cache)
    models = ModelsAPI(store, operations, Sources.configured(config.sources, os.environ, store))
    followers, logs = _follows(config, reactor, home, reloadable)
    gateway, records, teams = _gateway(config, reactor, store, scheduler, metrics, reloadable)
    history = RecordsAPI(records, followers)
    forwarder = _forwarder(config, reactor, runner_pool, cache)
    groups = route_groups(
        gateway=gateway,
        store=store,
        forwarder=forwarder,
        **_cache_parts(cache, scheduler),
        responses=_responses(config, reactor),
        models=models,
        operations=operations,
        metrics=metrics.registry,
        scraper=_scraper(config, reactor, checks, scheduler),
        logs=logs,
        history=history,
        backends=backends,
        max_request_bytes=config.max_request_bytes,
        reload=reloader.reload,
        devices=devices,
        usage=teams.book,
        docker_config=credentials.config_file,
    )
    site = GatedSite(Routes(groups), config, reactor, sinks=declared.sinks({"upload": models.upload}))
    reloadable.append(site.configure)
    closers = (runner_pool.close, registry_pool.closeCachedConnections)
    return Parts(site, scheduler, logs, history, closers, reloader, teams, forwarder)


def _responses(config: configuration.Config, reactor: Any) -> ResponseStore:
    """The Responses API's stored responses, in memory."""
    settings = config.responses
    return ResponseStore(reactor, settings.ttl, settings.max_count, settings.max_bytes)


def _store(config: configuration.Config, reactor: Any) -> ModelStore:
    """The home's model store; an index it may not read, or cannot move aside to rebuild, stops the start."""
    try:
        return ModelStore(config.home, reactor, config.store.partial_max_age)
    except StoreCorrupt as e:
        raise StartupError(e.message) from None


def _follows(
    config: configuration.Config, reactor: Any, home: Home, reloadable: list[Reconfigure]
) -> tuple[Followers, LogsAPI]:
    """/logs and /engines/requests follows, under one cap (reloadable), and the logs' API."""
    followers = Followers(config)
    reloadable.append(followers.configure)
    return followers, LogsAPI(home.logs, reactor, followers)


def _scraper(config: configuration.Config, reactor: Any, checks: RunnerChecks, scheduler: Scheduler) -> Any:
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


def _cache_parts(cache: PromptCache | None, scheduler: Scheduler) -> dict[str, Any]:
    """The route groups' part the prompt cache adds, its states' routes and the page's counts; and the
    loader's choice of instance (the one whose slot holds a conversation's earlier turn)."""
    if cache is None:
        return {}
    scheduler.loader.prefer = cache.prefer
    return {"cache": cache.store, "cache_counts": cache.by_model}


def _runners(
    config: configuration.Config, reactor: Any, pool: RunnerPool, checks: RunnerChecks, metrics: Metrics
) -> tuple[PromptCache | None, StartRunner]:
    """The prompt cache, if on, and how a runner's process is started: its slots saved by the prompt
    cache before a planned stop when there is one."""
    cache = prompt_cache(config, reactor, pool, lambda request: caller(request).owner, cache_source)
    if cache is not None:
        metrics.registry.register(CacheCollector(cache))
    start: StartRunner = partial(new_process, reactor, checks.healthy, _runner_options(config))
    return cache, start if cache is None else cache.start_runner(start)


def _scheduling(
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


def _operations(
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


def _gateway(
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


def make_service(
    config: configuration.Config, reactor: Any, read_config: Callable[[], configuration.Config] | None = None
) -> tuple[MultiService, Parts]:
    """The service tree: the home's lock, the daemon's log file, the scheduler, log follows, the HTTP server.

    @raise StartupError: the home cannot be created, or another daemon holds it.
    """
    lock = HomeLock(Home(config.home))  # first: before the store sweeps temps or the scheduler cleans runners
    log.info("configuration from {source}", source=config.source or "built-in defaults (no tap.conf found)")
    for unread in config.unread:
        log.warn(
            "{unread} is NOT read: {source} comes first (--config, else ./tap.conf, else"
            " the home's tap.conf); give --config {unread} to use it",
            unread=unread,
            source=config.source,
        )
    parts = make_parts(config, reactor, read_config)
    service = MultiService()
    lock.setServiceParent(service)
    DaemonLogFile(parts.scheduler.home, json=config.log.format == "json").setServiceParent(service)
    scheduling = SchedulerService(parts.scheduler, list(parts.closers), reactor, config.http.drain_timeout)
    scheduling.setServiceParent(service)
    parts.logs.setServiceParent(service)
    parts.history.setServiceParent(service)
    UsageService(parts.teams.book, reactor).setServiceParent(service)
    address = AddressFile(Home(config.home), config.listen)
    address.setServiceParent(service)
    Listener(reactor, private_listen(config.listen), parts.site, address.listening).setServiceParent(service)
    return service, parts


def makeService(options: Options) -> IService:
    from twisted.internet import reactor

    daemon_process()
    # What the daemon and its runners create under the home is their owner's alone, as twistd makes it
    # when it daemonizes; twistd --umask, applied after this, still decides.
    os.umask(PRIVATE_UMASK)
    service, parts = make_service(options.config, reactor, options.read_config)
    ReloadOnHangup(reactor, parts.reloader).setServiceParent(service)
    # Everything imported and built so far lives as long as the daemon: out of every collection.
    collector.settle()
    return service
