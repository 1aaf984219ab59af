"""Settings changed while runners run: C{POST /engines/_configure} for one model, a reload for all.

A new keep-alive or pin applies to the runners at once; a runner started with
another context size or other flags is stopped and started again with the new
ones, once it is idle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from mrunner.errors import Conflict
from mrunner.interfaces import ILease
from mrunner.scheduling.configured import Configured
from mrunner.scheduling.loader import Loader
from mrunner.values import ModelSettings, RunnerKey
from mrunner.values.model import Model
from mrunner.values.request import Resolved

#: Gets a lease for a resolved request (the scheduler's C{acquire}): how a restarted model loads again.
Acquire = Callable[[Resolved], Deferred[ILease]]


@attrs.define
class Reconfigurer:
    """Applies new settings to the runners they concern."""

    log = Logger()

    _configured: Configured
    _loader: Loader
    _acquire: Acquire

    def configure(self, backend: str, model: Model, settings: ModelSettings) -> Deferred[bool]:
        """Use C{settings} for C{model} (see C{IScheduler.configure}); fires with whether anything changed."""
        previous = self._configured.model(backend, model)
        wanted = settings.over(previous)
        if wanted == previous:
            return succeed(False)
        runner_settings = self._configured.runner(wanted)

        def match(key: RunnerKey) -> bool:
            return key.backend == backend and key.model == model.id

        def stale(key: RunnerKey) -> bool:
            return match(key) and self._loader.runners[key].request.settings != runner_settings

        restart = [runner for key, runner in self._loader.runners.items() if stale(key)]
        if any(runner.in_use for runner in restart):
            raise Conflict(
                f"model {model.name} is serving requests; configure it when it is idle", code="runner_busy"
            )
        self._configured.set(backend, model, settings)
        if wanted.keep_alive is not None:
            self._loader.keep_alive(match, wanted.keep_alive)
        if wanted.pinned != previous.pinned:
            self._loader.pin(match, bool(wanted.pinned))
        if not restart:
            return succeed(True)
        modes = [runner.key.mode for runner in restart]
        return self._loader.unload(stale).addCallback(lambda _: self._reload(backend, model, modes))

    def _reload(self, backend: str, model: Model, modes: Sequence[str]) -> bool:
        """Start C{model} again in each of C{modes}, without waiting for it to be ready."""
        for mode in modes:
            self._acquire(Resolved(backend, model, mode)).addCallbacks(
                lambda lease: lease.release(),
                lambda failure: self.log.failure("reloading {model} failed", failure, model=model.name),
            )
        return True

    def reloaded(self, apply: Callable[[], None]) -> None:
        """Run C{apply} (which puts a reloaded config in force), then give each runner the keep-alive
        and pin the new config sets for it: a keep-alive no request set follows the config's."""
        configured = self._configured
        before = {
            runner: configured.keep_alive(configured.model(runner.key.backend, runner.request.model))
            for runner in self._loader.runners.values()
        }
        apply()
        for runner, old in before.items():
            settings = configured.model(runner.key.backend, runner.request.model)
            new = configured.keep_alive(settings)
            same = runner.key.__eq__
            if runner.keep_alive == old and new != old:
                self._loader.keep_alive(same, new)
            if runner.pinned != bool(settings.pinned):
                self._loader.pin(same, bool(settings.pinned))
