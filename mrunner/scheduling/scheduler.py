"""The IScheduler: from (backend, model name, mode) to a lease on a ready runner."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from mrunner.backends.base import Command, RunnerSettings
from mrunner.config import Config
from mrunner.durations import timestamp
from mrunner.errors import Conflict, NotFound, Unprocessable
from mrunner.interfaces import IBackend, IModelStore, IScheduler
from mrunner.proxy import SOCKET_SUFFIX
from mrunner.scheduling.installer import Installer
from mrunner.scheduling.loader import NEVER, Lease, Loader, LoadRequest, Runner, RunnerKey, RunnerProcess
from mrunner.scheduling.policy import Limits, State
from mrunner.sizes import format_size
from mrunner.store.model import Model

StartRunner = Callable[[Command, str, Path, str], RunnerProcess]


@attrs.frozen
class ModelSettings:
    """What C{_configure} may change for one model; None keeps the default."""

    context_size: int | None = None
    flags: tuple[str, ...] | None = None
    keep_alive: float | None = None


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
    ):
        self._config = config
        self._backends = backends
        self._store = store
        self._start_runner = start_runner
        self.installer = Installer(backends, clock)
        self.loader = Loader(
            clock,
            self._spawn,
            Limits(config.scheduler.max_runners, config.scheduler.memory_budget),
            config.scheduler.max_queue,
        )
        self._settings: dict[tuple[str, str], ModelSettings] = {}
        self._names = (f"r{os.getpid()}-{n}" for n in itertools.count(1))

    @property
    def run_dir(self) -> Path:
        return self._config.home / "run"

    def backend_name(self, backend: str | None) -> str:
        """C{backend}, or the default one; L{NotFound} for a backend mrunner does not have."""
        name = backend or self._config.default_backend
        if name not in self._backends:
            raise NotFound(
                f"unknown backend {name!r}; available: {', '.join(sorted(self._backends))}",
                code="backend_not_found",
            )
        return name

    def backend_statuses(self) -> dict[str, str]:
        return self.installer.statuses()

    def start(self) -> None:
        """Install the default backend now; the others on first use."""
        self.installer.start(self.backend_name(None))

    def close(self) -> Deferred[None]:
        return self.loader.close()

    def acquire(
        self, backend: str | None, model: str, mode: str, keep_alive: float | None = None
    ) -> Deferred[Lease]:
        return ensureDeferred(self._acquire(self.backend_name(backend), model, mode, keep_alive))

    async def _acquire(self, backend: str, name: str, mode: str, keep_alive: float | None) -> Lease:
        model = self._store.resolve(name)
        await self.installer.wait(backend, self._config.scheduler.install_wait)
        configured = self._model_settings(backend, model)
        settings = self._runner_settings(configured)
        memory = self._backends[backend].memory(model, mode, settings)
        budget = self._config.scheduler.memory_budget
        if budget and memory > budget:
            raise Unprocessable(
                f"model {model.name} needs about {format_size(memory)} of memory but the whole memory budget"
                f" is {format_size(budget)}; raise [scheduler] memory_budget or use a smaller context size",
                code="model_too_large",
            )
        request = LoadRequest(
            RunnerKey(backend, model.id, mode),
            model,
            settings,
            self._keep_alive(configured) if keep_alive is None else keep_alive,
            memory,
            sets_keep_alive=keep_alive is not None,
        )
        return await self.loader.acquire(request)

    def _runner_settings(self, configured: ModelSettings) -> RunnerSettings:
        return RunnerSettings(
            context_size=configured.context_size or self._config.runner.context_size,
            parallel=self._config.scheduler.parallel,
            threads=self._config.runner.threads,
            flags=configured.flags or (),
        )

    def _keep_alive(self, configured: ModelSettings) -> float:
        default = self._config.scheduler.keep_alive
        return default if configured.keep_alive is None else configured.keep_alive

    def _model_settings(self, backend: str, model: Model) -> ModelSettings:
        return self._settings.get((backend, model.id), ModelSettings())

    def _spawn(self, key: RunnerKey, model: Model, settings: RunnerSettings) -> RunnerProcess:
        name = next(self._names)
        socket = str(self.run_dir / (name + SOCKET_SUFFIX))  # where the proxy looks for it
        command = self._backends[key.backend].command(model, key.mode, socket, settings)
        label = f"{model.name} ({key.mode})"
        log_path = self._config.home / "logs" / f"{_file_safe(model.name)}-{key.mode}.log"
        return self._start_runner(command, socket, log_path, label)

    def running(self) -> list[dict[str, Any]]:
        return [_describe(runner) for runner in self.loader.runners.values()]

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
        except NotFound:
            return name

    def configuration(self, backend: str | None, model: str) -> dict[str, Any]:
        """What C{model}'s next runner starts with, for C{GET /engines/_configure}."""
        name = self.backend_name(backend)
        resolved = self._store.resolve(model)
        configured = self._model_settings(name, resolved)
        return {
            "backend": name,
            "model": resolved.name,
            "context_size": configured.context_size or self._config.runner.context_size,
            "runtime_flags": list(configured.flags or ()),
            "keep_alive": self._keep_alive(configured),
        }

    def configure(self, backend: str | None, model: str, settings: ModelSettings) -> Deferred[bool]:
        """Use C{settings} for C{model}; fires with whether anything changed.

        The same settings again change nothing, even while the model is busy.
        A new keep-alive applies to its runners at once. Runners started with
        another context size or other flags restart with the new ones
        (L{Conflict} while one of them serves).
        """
        name = self.backend_name(backend)
        resolved = self._store.resolve(model)
        previous = self._model_settings(name, resolved)
        wanted = attrs.evolve(
            previous, **{k: v for k, v in attrs.asdict(settings, recurse=False).items() if v is not None}
        )
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
        self._settings[(name, resolved.id)] = wanted
        if wanted.keep_alive is not None:
            self.loader.keep_alive(match, wanted.keep_alive)
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


def _describe(runner: Runner) -> dict[str, Any]:
    """One runner as C{GET /engines/ps} shows it; C{memory} is what the budget counts."""
    return {
        "backend_name": runner.key.backend,
        "model_name": runner.request.model.name,
        "model_id": runner.key.model,
        "mode": runner.key.mode,
        "state": runner.state.value,
        "loading": runner.state is State.LOADING,
        "draining": runner.state is State.DRAINING,
        "in_use": runner.in_use,
        "parallel": runner.parallel,
        "last_used": timestamp(runner.finished_at),
        "keep_alive": None if runner.keep_alive == NEVER else runner.keep_alive,
        "expires_at": runner.expiry and timestamp(runner.expiry.getTime()),
        "memory": runner.memory,
        "memory_estimate": runner.request.memory,
        "memory_measured": runner.process.rss(),
        **runner.process.describe(),
    }


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)
