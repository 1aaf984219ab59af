"""The IScheduler: from a resolved request to a lease on a ready runner.

A façade over the parts that each do one job: the settings in force
(L{configured}), building the loader's request and checking it fits
(L{requests}, L{fitting}), preloads (L{preloading}), settings changed while
runners run (L{configuring}), runners' processes (L{spawning}) and snapshots
(L{snapshots}); the loader (L{loader}) keeps the runners and the queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from mrunner.config import Config
from mrunner.errors import BadRequest, NotFound
from mrunner.home import Home
from mrunner.interfaces import IBackend, IDevices, ILease, ILoaderEvents, IModelStore, IScheduler
from mrunner.scheduling.configured import Configured
from mrunner.scheduling.configuring import Reconfigurer
from mrunner.scheduling.installer import Installer
from mrunner.scheduling.lease import Lease
from mrunner.scheduling.load_times import LoadTimes
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.order import BY_NAME, Rules
from mrunner.scheduling.policy import Limits
from mrunner.scheduling.preloading import Preloader, PullModel
from mrunner.scheduling.requests import Requests
from mrunner.scheduling.snapshots import snapshot
from mrunner.scheduling.spawning import Spawner, StartRunner
from mrunner.values import InstallStatus, ModelSettings, Preload, RunnerKey, RunnerSnapshot, Waiting
from mrunner.values.backend import RunnerSettings
from mrunner.values.request import Resolved


@implementer(IScheduler)
class Scheduler:
    """Waits for the backend's install, then queues the request for a runner."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        config: Config,
        backends: Mapping[str, IBackend],
        store: IModelStore,
        start_runner: StartRunner,
        home: Home | None = None,
        events: ILoaderEvents | None = None,
        devices: IDevices | None = None,
        pull: PullModel | None = None,
    ):
        self._backends = backends
        self._store = store
        self._configured = Configured(config, store)
        self.home = home or Home(config.home)
        # What the build lists is known once it is installed: [gpu] devices is checked against it then.
        self.installer = Installer(backends, clock, lambda name: devices.check() if devices else None)
        spawn = Spawner(self.home, backends, start_runner)
        self.loader = Loader(
            clock,
            spawn,
            _limits(config),
            config.scheduler.max_queue,
            events,
            devices,
            config.scheduler.starvation_seconds,
            estimate=lambda request: self._requests.estimated(request),
            rules=_rules(config),
            load_times=LoadTimes(self.home.load_times),
        )
        self._requests = Requests(backends, store, self.installer, self.loader, self._configured)
        self._preloads = Preloader(store, self._requests, self.loader, lambda: self.backend_name(None), pull)
        self._reconfigurer = Reconfigurer(self._configured, self.loader, self.acquire)
        #: The loader's lease each request in its queue waits for, by the request's identity (L{ahead}).
        self._queued: dict[int, Deferred[Lease]] = {}

    @property
    def _config(self) -> Config:
        return self._configured.config

    def backend_name(self, backend: str | None) -> str:
        """C{backend}, or the default one; L{NotFound} for a backend mrunner does not have."""
        name = backend or self._config.default_backend
        if name not in self._backends:
            raise NotFound(
                f"unknown backend {name!r}; available: {', '.join(sorted(self._backends))}",
                code="backend_not_found",
            )
        return name

    def backend_statuses(self) -> dict[str, InstallStatus]:
        return self.installer.statuses()

    def queued(self) -> int:
        return self.loader.queued

    def waiting(self) -> list[Waiting]:
        return self.loader.waiting()

    def memory_budget(self) -> int:
        return self._config.scheduler.memory_budget

    def max_runners(self) -> int:
        """C{[scheduler] max_runners} as configured now (a reload changes it)."""
        return self._config.scheduler.max_runners

    def start(self) -> None:
        """Install the default backend now, the others on first use; then load the preloads."""
        self.installer.start(self.backend_name(None))
        self._preloads.configure(self._config.models.preload)

    def close(self) -> Deferred[None]:
        return self.loader.close()

    def drain(self) -> Deferred[None]:
        if not self.loader.draining:
            self.log.info("draining: new requests get 503; {count} in flight finish", count=self.in_flight())
        return self.loader.drain()

    def draining(self) -> bool:
        return self.loader.draining

    def in_flight(self) -> int:
        return self.loader.in_flight

    def admit(self) -> None:
        self.loader.admit()

    def acquire(self, request: Resolved) -> Deferred[ILease]:
        return ensureDeferred(self._acquire(request))

    async def _acquire(self, asked: Resolved) -> ILease:
        self.loader.admit()  # a draining node refuses before it waits for an install
        request = await self._requests.build(asked, self._config.scheduler.install_wait)
        queued = self._queued[id(asked)] = self.loader.acquire(request, asked.rank)
        try:
            return await queued
        finally:
            del self._queued[id(asked)]

    def ahead(self, request: Resolved) -> int | None:
        """By identity: the gateway holds the request it passed to L{acquire} as long as it waits."""
        queued = self._queued.get(id(request))
        return None if queued is None else self.loader.ahead(queued)

    def preloads(self) -> list[Preload]:
        return self._preloads.all()

    def reconfigure(self, config: Config) -> None:
        """Limits, keep-alive defaults, pins and preloads from a reloaded C{tap.conf}, at once.

        Per-model settings apply to the next load; C{snapshot} marks the runners they make stale.
        """

        def apply() -> None:
            self._configured.config = config
            self.loader.pacing.rules = _rules(config)
            self.loader.reconfigure(_limits(config), config.scheduler.max_queue)

        self._reconfigurer.reloaded(apply)
        self._preloads.configure(config.models.preload)

    def snapshot(self) -> list[RunnerSnapshot]:
        return [snapshot(runner, self._configured, self._backends) for runner in self.loader.runners.values()]

    def unload(self, backend: str | None, models: Sequence[str], all: bool) -> Deferred[int]:
        """Stop matching runners (idle now, busy ones once drained); fires with how many."""
        ids = {self._model_id(name) for name in models}
        count = 0

        def match(key: RunnerKey) -> bool:
            nonlocal count
            hit = all or ((backend is None or key.backend == backend) and key.model in ids)
            count += hit
            return hit

        return self.loader.unload(match).addCallback(lambda _: count)

    def _model_id(self, name: str) -> str:
        try:
            return self._store.resolve(name).id
        except (NotFound, BadRequest):  # matches no runner: nothing to unload
            return name

    def configuration(self, backend: str | None, model: str) -> dict[str, Any]:
        """What C{model}'s next runner starts with, for C{GET /engines/_configure}."""
        name = self.backend_name(backend)
        resolved = self._store.resolve(model)
        configured = self._configured.model(name, resolved)
        context_size = self._configured.context_size(configured)
        context = self._backends[name].context(resolved, RunnerSettings(context_size=context_size))
        return {
            "backend": name,
            "model": resolved.name,
            "context_size": context_size,
            "context_size_in_force": context.in_force,
            "warning": context.note(resolved.name),
            **self._configured.shown(configured),
        }

    def configure(self, backend: str | None, model: str, settings: ModelSettings) -> Deferred[bool]:
        """Use C{settings} for C{model}; fires with whether anything changed.

        The same settings again change nothing, even while the model is busy.
        A new keep-alive or pin applies to its runners at once. Runners started with
        another context size or other flags restart with the new ones
        (L{Conflict} while one of them serves).
        """
        return maybeDeferred(self._configure, backend, model, settings)

    def _configure(self, backend: str | None, model: str, settings: ModelSettings) -> Deferred[bool]:
        return self._reconfigurer.configure(self.backend_name(backend), self._store.resolve(model), settings)


def _limits(config: Config) -> Limits:
    return Limits(config.scheduler.max_runners, config.scheduler.memory_budget)


def _rules(config: Config) -> Rules:
    """C{[scheduler]}'s rules, its C{order} chosen here once by name."""
    scheduler = config.scheduler
    return Rules(
        BY_NAME[scheduler.order], scheduler.max_wait, scheduler.min_serve, scheduler.starvation_seconds
    )
