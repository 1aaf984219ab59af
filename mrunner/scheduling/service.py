"""The scheduler as a Twisted service: clean up, install at start; stop every runner at stop."""

from __future__ import annotations

from twisted.application.service import Service
from twisted.internet.defer import Deferred

from mrunner.scheduling.runner import clean_stale
from mrunner.scheduling.scheduler import Scheduler


class SchedulerService(Service):
    """Its C{stopService} fires only when every runner process has exited."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler

    def startService(self) -> None:
        clean_stale(self.scheduler.run_dir)
        (self.scheduler.run_dir.parent / "logs").mkdir(parents=True, exist_ok=True)
        super().startService()
        self.scheduler.start()

    def stopService(self) -> Deferred[None]:
        super().stopService()
        return self.scheduler.close()
