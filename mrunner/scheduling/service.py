"""The scheduler as a Twisted service: clean up, install at start; drain, then stop every runner at stop."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.application.service import Service
from twisted.internet.defer import Deferred, TimeoutError, ensureDeferred, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from mrunner.runners.process import clean_stale
from mrunner.scheduling.facade import Scheduler


class SchedulerService(Service):
    """Its C{stopService} fires only when every runner process has exited.

    Stopping (SIGTERM) drains first, as C{POST /engines/_drain} does: new
    requests get 503, and those in flight have C{drain_timeout} seconds to
    finish before the runners are stopped under them. A rolling update loses
    nothing that ends within that time.
    """

    log = Logger()

    def __init__(
        self,
        scheduler: Scheduler,
        closers: Sequence[Callable[[], object]] = (),
        clock: IReactorTime | None = None,
        drain_timeout: float = 0.0,
    ):
        self.scheduler = scheduler
        self._closers = closers
        self._clock = clock
        self._drain_timeout = drain_timeout

    def startService(self) -> None:
        clean_stale(self.scheduler.home)
        super().startService()
        self.scheduler.start()

    def stopService(self) -> Deferred[None]:
        """Drain, stop the runners, then run the closers (connection pools) once nothing uses them."""
        super().stopService()
        return ensureDeferred(self._stop())

    async def _stop(self) -> None:
        await self._drain()
        await self.scheduler.close()
        for close in self._closers:
            await maybeDeferred(close)

    async def _drain(self) -> None:
        if self._clock is None or self._drain_timeout <= 0:
            return
        drained = self.scheduler.drain()
        drained.addTimeout(self._drain_timeout, self._clock)
        try:
            await drained
        except TimeoutError:
            self.log.warn(
                "drain_timeout ({seconds}s) passed with {count} request(s) in flight: stopping them",
                seconds=self._drain_timeout,
                count=self.scheduler.in_flight(),
            )
