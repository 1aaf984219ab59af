"""The scheduler as a Twisted service: clean up, install at start; stop every runner at stop."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.application.service import Service
from twisted.internet.defer import Deferred, ensureDeferred, maybeDeferred

from mrunner.scheduling.process import clean_stale
from mrunner.scheduling.scheduler import Scheduler


class SchedulerService(Service):
    """Its C{stopService} fires only when every runner process has exited."""

    def __init__(self, scheduler: Scheduler, closers: Sequence[Callable[[], object]] = ()):
        self.scheduler = scheduler
        self._closers = closers

    def startService(self) -> None:
        clean_stale(self.scheduler.home)
        super().startService()
        self.scheduler.start()

    def stopService(self) -> Deferred[None]:
        """Stop the runners, then run the closers (connection pools) once nothing uses them."""
        super().stopService()
        return ensureDeferred(self._stop())

    async def _stop(self) -> None:
        await self.scheduler.close()
        for close in self._closers:
            await maybeDeferred(close)
