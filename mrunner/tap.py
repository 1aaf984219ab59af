"""``twistd mrunner``: command-line options and the service tree. The one place that wires parts."""

from __future__ import annotations

# First: the imports below load Twisted without pyOpenSSL, until TLS is used (see lazytls).
import mrunner.daemon.lazytls  # isort: skip

import os
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from twisted.application.service import IService, MultiService
from twisted.logger import Logger
from twisted.python import usage

from mrunner import assembly
from mrunner import config as configuration
from mrunner.api.door.routing import Routes
from mrunner.api.door.site import GatedSite, private_listen
from mrunner.api.manage.models import ModelsAPI
from mrunner.api.observe.logs import LogsAPI
from mrunner.api.observe.records_api import RecordsAPI
from mrunner.api.route_groups import route_groups
from mrunner.daemon import collector
from mrunner.daemon.listening import AddressFile, uses_tls
from mrunner.daemon.logfiles import DaemonLogFile
from mrunner.daemon.metrics import Metrics
from mrunner.daemon.reload import Reconfigure, Reloader, ReloadOnHangup
from mrunner.daemon.startup import HomeLock, Listener, StartupError, check_listen, daemon_process
from mrunner.home import PRIVATE_UMASK, Home
from mrunner.names import parse
from mrunner.proxy.forwarder import Forwarder
from mrunner.proxy.pool import RunnerPool, unix_connect
from mrunner.runners.checks import RunnerChecks
from mrunner.scheduling.facade import Scheduler
from mrunner.scheduling.service import SchedulerService
from mrunner.store.clientpool import QuietPool
from mrunner.store.credentials import Credentials
from mrunner.store.sources.catalog import Sources
from mrunner.teams.admission import Teams
from mrunner.teams.usage import UsageService

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


def make_parts(
    config: configuration.Config, reactor: Any, read_config: Callable[[], configuration.Config] | None = None
) -> Parts:
    """Build every part of the daemon from C{config}; C{read_config} reads it again for a reload."""
    home = Home(config.home)
    backends = assembly.make_backends(config, reactor)
    store = assembly.make_store(config, reactor)
    runner_pool = RunnerPool(reactor, unix_connect(reactor), max(config.scheduler.parallel, 2))
    metrics = Metrics()
    # Health checks and /metrics scrapes: a new runner connection each, none kept (the pool is for requests).
    checks = RunnerChecks(runner_pool.fetch)

    # A preload missing from the store is pulled (operations is built below, before any start).
    def pull(name: str) -> Awaitable[object]:
        return operations.pull(parse(name), operations.progress(lambda line: None, "pull"))

    cache, start_runner = assembly.make_runners(config, reactor, runner_pool, checks, metrics)
    scheduler, devices = assembly.make_scheduling(
        config, reactor, backends, store, home, start_runner, metrics, pull
    )
    # What a reload hands the new configuration to, in order. The Reloader holds this list:
    # a part built further down (the front door's trust settings) is appended to it.
    reloadable: list[Reconfigure] = [scheduler.reconfigure, *([cache.configure] if cache else [])]
    reloader = Reloader(read_config or (lambda: config), config, reloadable)
    registry_pool = QuietPool(reactor)
    # Docker's config and credential helpers, after [registry.auth]; helpers see the daemon's environment.
    credentials = Credentials(config.registry.auth, reactor, os.environ)
    operations = assembly.make_operations(
        config, reactor, store, scheduler, metrics, registry_pool, credentials, cache
    )
    models = ModelsAPI(store, operations, Sources.configured(config.sources, os.environ, store))
    followers, logs = assembly.make_follows(config, reactor, home, reloadable)
    gateway, records, teams = assembly.make_gateway(config, reactor, store, scheduler, metrics, reloadable)
    history = RecordsAPI(records, followers)
    forwarder = assembly.make_forwarder(config, reactor, runner_pool, cache)
    groups = route_groups(
        gateway=gateway,
        store=store,
        forwarder=forwarder,
        **assembly.cache_parts(cache, scheduler),
        responses=assembly.make_responses(config, reactor),
        models=models,
        operations=operations,
        metrics=metrics.registry,
        scraper=assembly.make_scraper(config, reactor, checks, scheduler),
        logs=logs,
        history=history,
        backends=backends,
        max_request_bytes=config.max_request_bytes,
        reload=reloader.reload,
        devices=devices,
        usage=teams.book,
        docker_config=credentials.config_file,
    )
    routes = Routes(groups)
    site = GatedSite(routes, config, reactor, sinks=routes.door.sinks({"upload": models.upload}))
    reloadable.append(site.configure)
    closers = (runner_pool.close, registry_pool.closeCachedConnections)
    return Parts(site, scheduler, logs, history, closers, reloader, teams, forwarder)


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
