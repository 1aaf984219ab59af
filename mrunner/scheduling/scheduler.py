"""The IScheduler: from (backend, model name, mode) to a lease on a ready runner."""

from __future__ import annotations

import itertools
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, ensureDeferred, maybeDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from mrunner.config import Config
from mrunner.errors import BadRequest, Conflict, MrunnerError, NotFound, Unprocessable
from mrunner.home import Home
from mrunner.interfaces import (
    IBackend,
    IDevices,
    ILease,
    ILoaderEvents,
    IModelStore,
    IRunnerProcess,
    IScheduler,
)
from mrunner.runners.request import LoadRequest
from mrunner.runners.runner import Runner
from mrunner.scheduling import priority
from mrunner.scheduling.installer import Installer
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.policy import Limits, place
from mrunner.scheduling.preloads import Preloads
from mrunner.sizes import format_size
from mrunner.values import (
    HOST,
    ContextSize,
    Footprint,
    InstallStatus,
    ModelSettings,
    Preload,
    RunnerKey,
    RunnerSnapshot,
)
from mrunner.values.backend import COMPLETION, Command, RunnerSettings
from mrunner.values.model import Model

#: A runner's process for a command, socket, log and label, which the runner's machine spawns.
StartRunner = Callable[[Command, str, Path, str], IRunnerProcess]
#: Fetches a model that is not in the store from its registry (a preload's, at start).
PullModel = Callable[[str], Awaitable[object]]
#: llama-server's flags that set the context size: a model given one in its flags has it fixed.
CONTEXT_FLAGS = {"-c", "--ctx-size"}


@implementer(IScheduler)
class Scheduler:
    """Checks the backend and the model, waits for the install, then queues for a runner."""

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
        self._config = config
        self._pull = pull
        self._backends = backends
        self._store = store
        self._start_runner = start_runner
        self.home = home or Home(config.home)
        # What the build lists is known once it is installed: [gpu] devices is checked against it then.
        self.installer = Installer(backends, clock, lambda name: devices.check() if devices else None)
        self.loader = Loader(
            clock,
            self._spawn,
            _limits(config),
            config.scheduler.max_queue,
            events,
            devices,
            estimate=self._estimated,
        )
        self.loader.starvation = config.scheduler.starvation_seconds
        self._settings: dict[tuple[str, str], ModelSettings] = {}
        self._names = (f"r{os.getpid()}-{n}" for n in itertools.count(1))
        self._preloads = Preloads()

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

    def memory_budget(self) -> int:
        return self._config.scheduler.memory_budget

    def max_runners(self) -> int:
        """C{[scheduler] max_runners} as configured now (a reload changes it)."""
        return self._config.scheduler.max_runners

    def start(self) -> None:
        """Install the default backend now, the others on first use; then load the preloads."""
        self.installer.start(self.backend_name(None))
        self._preload(self._config.models.preload)

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

    def acquire(
        self,
        backend: str | None,
        model: str,
        mode: str,
        keep_alive: float | None = None,
        rank: int = priority.NORMAL,
    ) -> Deferred[ILease]:
        return ensureDeferred(self._acquire(backend, model, mode, keep_alive, rank))

    async def _acquire(
        self, backend: str | None, name: str, mode: str, keep_alive: float | None, rank: int
    ) -> ILease:
        self.loader.admit()  # a draining node refuses before it checks the model or waits for an install
        request = await self._request(backend, name, mode, keep_alive, self._config.scheduler.install_wait)
        return await self.loader.acquire(request, rank)

    async def _request(
        self,
        backend_name: str | None,
        name: str,
        mode: str,
        keep_alive: float | None,
        install_wait: float | None,
    ) -> LoadRequest:
        """What the loader needs for C{name}: the backend installed, the model found, its memory checked."""
        backend = self.backend_name(backend_name)
        model = self._store.resolve(name)
        # The store checks a model's files (sizes; digests once since start) before a load,
        # not on every request a runner already holding the model serves.
        runner = self.loader.runners.get(RunnerKey(backend, model.id, mode))
        if model.problem is not None or runner is None:
            runner = None
            model = await self._store.ready(name)
        await self.installer.wait(backend, install_wait)
        configured = self._model_settings(backend, model)
        settings = self._runner_settings(configured)
        if configured.draft_model and runner is None:
            await self._store.ready(configured.draft_model)
        request = LoadRequest(
            RunnerKey(backend, model.id, mode),
            model,
            settings,
            self._keep_alive(configured) if keep_alive is None else keep_alive,
            sets_keep_alive=keep_alive is not None,
            pinned=bool(configured.pinned),
            instances=self._instances(model),
        )
        if runner is not None and runner.request.asked == settings:  # the same estimate, already made
            old = runner.request
            request = attrs.evolve(
                request,
                settings=old.settings,
                memory=old.memory,
                footprint=old.footprint,
                context=old.context,
            )
        else:
            request = self._estimated(
                attrs.evolve(request, context=self._context_left(backend, model, settings))
            )
        memory, footprint = request.memory, request.footprint
        budget = self._config.scheduler.memory_budget
        gpus = self.loader.gpus(fresh=runner is None)
        if gpus and footprint is not None:
            _check_fits(model.name, footprint, gpus, budget)
        elif budget and memory > budget:
            raise Unprocessable(
                f"model {model.name} needs about {format_size(memory)} of memory but the whole memory budget"
                f" is {format_size(budget)}; raise [scheduler] memory_budget or use a smaller context size",
                code="model_too_large",
            )
        return request

    def _estimated(self, request: LoadRequest) -> LoadRequest:
        """C{request} with the memory and footprint its backend estimates for its settings."""
        backend, mode = self._backends[request.key.backend], request.key.mode
        return attrs.evolve(
            request,
            memory=backend.memory(request.model, mode, request.settings),
            footprint=backend.footprint(request.model, mode, request.settings),
        )

    def _context_left(self, backend: str, model: Model, settings: RunnerSettings) -> ContextSize | None:
        """The context a runner of C{model} gets when no one fixed its size (not its settings, its
        flags nor a choice in its config), which a load out of device memory may halve; else None."""
        flags = {flag.partition("=")[0] for flag in settings.flags}
        if settings.context_size or model.chosen_context or flags & CONTEXT_FLAGS:
            return None
        return self._backends[backend].context(model, settings)

    # Preloads

    def preloads(self) -> list[Preload]:
        return self._preloads.all()

    def _preload(self, names: Sequence[str]) -> None:
        """Load C{names} in order once the backend is installed; one that fails is reported, not fatal."""
        new = self._preloads.configure(names)
        if new:
            ensureDeferred(self._preload_each(new))

    async def _preload_each(self, names: Sequence[str]) -> None:
        for name in names:
            loading = self._preloads.take(name)
            if loading is None:
                continue  # dropped by a reload meanwhile, or another reload's loading it
            try:
                await self._preload_one(name)
            except MrunnerError as e:
                self.log.warn("preloading {model} failed: {error}", model=name, error=e.message)
                self._preloads.finish(loading, e.message)
            except Exception as e:
                self.log.failure("preloading {model} failed", model=name)
                self._preloads.finish(loading, f"preloading {name} failed: {e}")
            else:
                self.log.info("preloaded {model}", model=name)
                self._preloads.finish(loading)

    async def _preload_one(self, name: str) -> None:
        await self._pull_missing(name)
        request = await self._request(None, name, COMPLETION, None, install_wait=None)
        if request.key not in self.loader.runners and not self.loader.fits(request.memory, request.footprint):
            raise Unprocessable(
                f"preload {name} does not fit beside the runners already loaded"
                f" ({format_size(request.memory)} needed); raise [scheduler] memory_budget or max_runners",
                code="preload_does_not_fit",
            )
        lease = await self.loader.acquire(request)
        lease.release()

    async def _pull_missing(self, name: str) -> None:
        """Pull a preload the store does not have, so a new node needs only its tap.conf and a registry."""
        try:
            self._store.resolve(name)
        except NotFound:
            if self._pull is None:
                raise
            self.log.info("preload {model} is not in the store: pulling it", model=name)
            await self._pull(name)

    # Reload

    def reconfigure(self, config: Config) -> None:
        """Limits, keep-alive defaults, pins and preloads from a reloaded C{tap.conf}, at once.

        Per-model settings apply to the next load; C{snapshot} marks the runners they make stale.
        """
        before = {
            runner: self._keep_alive(self._model_settings(runner.key.backend, runner.request.model))
            for runner in self.loader.runners.values()
        }
        self._config = config
        self.loader.starvation = config.scheduler.starvation_seconds
        self.loader.reconfigure(_limits(config), config.scheduler.max_queue)
        for runner, old in before.items():
            configured = self._model_settings(runner.key.backend, runner.request.model)
            new = self._keep_alive(configured)
            same = runner.key.__eq__
            if runner.keep_alive == old and new != old:
                self.loader.keep_alive(same, new)
            if runner.pinned != bool(configured.pinned):
                self.loader.pin(same, bool(configured.pinned))
        self._preload(config.models.preload)

    def _runner_settings(self, configured: ModelSettings) -> RunnerSettings:
        return RunnerSettings(
            context_size=configured.context_size or self._config.runner.context_size,
            parallel=self._config.scheduler.parallel,
            threads=self._config.runner.threads,
            flags=configured.flags or (),
            draft=self._draft(configured.draft_model),
        )

    def _draft(self, name: str | None) -> Model | None:
        """The draft model named in the settings, if any (it must still be in the store)."""
        if not name:
            return None
        try:
            return self._store.resolve(name)
        except NotFound:
            raise NotFound(
                f"draft model {name} is not in the store; pull it, or configure the model without it",
                code="draft_model_not_found",
            ) from None

    def _keep_alive(self, configured: ModelSettings) -> float:
        default = self._config.scheduler.keep_alive
        return default if configured.keep_alive is None else configured.keep_alive

    def _model_settings(self, backend: str, model: Model) -> ModelSettings:
        """C{[models."NAME"]} from C{tap.conf}, overridden by what C{_configure} set."""
        configured = self._settings.get((backend, model.id), ModelSettings())
        files = self._config.models.settings
        entry = next((files[tag] for tag in model.tags if tag in files), None)
        if entry is None:
            return configured
        base = ModelSettings(
            context_size=entry.context_size, keep_alive=entry.keep_alive, pinned=entry.pinned
        )
        return configured.over(base)

    def _instances(self, model: Model) -> int:
        """C{[models."NAME"] instances}: how many runners of C{model} may serve at once."""
        files = self._config.models.settings
        return next((files[tag].instances for tag in model.tags if tag in files), 1)

    def _spawn(self, key: RunnerKey, model: Model, settings: RunnerSettings) -> IRunnerProcess:
        socket = self.home.socket(next(self._names))
        backend = self._backends[key.backend]
        command = backend.command(model, key.mode, socket, settings)
        note = backend.context(model, settings).note(model.name)
        if note is not None:
            self.log.warn("{note}", note=note)
        label = f"{model.name} ({key.mode})"
        return self._start_runner(command, socket, self.home.runner_log(model.name, key.mode), label)

    def snapshot(self) -> list[RunnerSnapshot]:
        return [self._snapshot(runner) for runner in self.loader.runners.values()]

    def _snapshot(self, runner: Runner) -> RunnerSnapshot:
        try:
            wanted = self._runner_settings(self._model_settings(runner.key.backend, runner.request.model))
        except NotFound:  # its draft model was removed: the next load fails, so this runner is stale
            wanted = None
        return RunnerSnapshot(
            backend=runner.key.backend,
            model_name=runner.request.model.name,
            model_id=runner.key.model,
            mode=runner.key.mode,
            state=runner.state,
            in_use=runner.in_use,
            parallel=runner.parallel,
            last_used=runner.finished_at,
            keep_alive=runner.keep_alive,
            expires_at=runner.expires_at,
            memory=runner.memory,
            memory_estimate=runner.request.memory,
            memory_measured=runner.process.rss(),
            pid=runner.process.pid,
            socket=runner.socket,
            pinned=runner.pinned,
            stale=runner.request.asked != wanted,
            context=self._backends[runner.key.backend].context(runner.request.model, runner.request.settings),
            devices={**runner.on_gpus, HOST: runner.memory},
            gpu_layers=runner.gpu_layers,
            instance=runner.key.instance,
        )

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
        configured = self._model_settings(name, resolved)
        context_size = configured.context_size or self._config.runner.context_size
        context = self._backends[name].context(resolved, RunnerSettings(context_size=context_size))
        return {
            "backend": name,
            "model": resolved.name,
            "context_size": context_size,
            "context_size_in_force": context.in_force,
            "warning": context.note(resolved.name),
            "runtime_flags": list(configured.flags or ()),
            "keep_alive": self._keep_alive(configured),
            "pinned": bool(configured.pinned),
            "speculative": {"draft_model": configured.draft_model or None},
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
        name = self.backend_name(backend)
        resolved = self._store.resolve(model)
        previous = self._model_settings(name, resolved)
        wanted = settings.over(previous)
        if wanted == previous:
            return succeed(False)
        runner_settings = self._runner_settings(wanted)

        def match(key: RunnerKey) -> bool:
            return key.backend == name and key.model == resolved.id

        def stale(key: RunnerKey) -> bool:
            return match(key) and self.loader.runners[key].request.settings != runner_settings

        restart = [runner for key, runner in self.loader.runners.items() if stale(key)]
        if any(runner.in_use for runner in restart):
            raise Conflict(
                f"model {resolved.name} is serving requests; configure it when it is idle",
                code="runner_busy",
            )
        self._settings[(name, resolved.id)] = settings.over(
            self._settings.get((name, resolved.id), ModelSettings())
        )
        if wanted.keep_alive is not None:
            self.loader.keep_alive(match, wanted.keep_alive)
        if wanted.pinned != previous.pinned:
            self.loader.pin(match, bool(wanted.pinned))
        if not restart:
            return succeed(True)
        modes = [runner.key.mode for runner in restart]
        return self.loader.unload(stale).addCallback(lambda _: self._reload(name, resolved.name, modes))

    def _reload(self, backend: str, model: str, modes: Sequence[str]) -> bool:
        """Start C{model} again in each of C{modes}, without waiting for it to be ready."""
        for mode in modes:
            self.acquire(backend, model, mode).addCallbacks(
                lambda lease: lease.release(),
                lambda failure: self.log.failure("reloading {model} failed", failure, model=model),
            )
        return True


def _limits(config: Config) -> Limits:
    return Limits(config.scheduler.max_runners, config.scheduler.memory_budget)


def _check_fits(name: str, footprint: Footprint, gpus: Sequence[tuple[str, int]], budget: int) -> None:
    """L{Unprocessable} naming where C{footprint} falls short with every GPU's whole budget its own."""
    placement = place(footprint, dict(gpus), [device for device, _ in gpus])
    if not budget or placement.in_ram <= budget:
        return
    on_gpus = ", ".join(f"{device} {format_size(size)}" for device, size in placement.on_gpus.items())
    raise Unprocessable(
        f"model {name} needs about {format_size(footprint.total)} of memory; with"
        f" {placement.gpu_layers} of its {footprint.layers} layers on the GPUs ({on_gpus or 'none fits'}),"
        f" CPU needs {format_size(placement.in_ram)}, {format_size(placement.in_ram - budget)} over the"
        f" memory budget of {format_size(budget)}; raise [scheduler] memory_budget or [gpu] memory_budget,"
        " or use a smaller context size",
        code="model_too_large",
    )
