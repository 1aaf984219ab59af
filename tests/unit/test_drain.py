"""Draining a node: the loader refuses new requests, serves those it has, then says it is done.

The API's side (a 503 with Retry-After in each API's shape, C{/ready}, C{POST
/engines/_drain}) is in test_api and test_compat_api; the real daemon behind a
router in tests/real/test_cluster_real.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.config import Config
from mrunner.errors import Unavailable
from mrunner.scheduling.facade import Scheduler
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.policy import Limits
from mrunner.scheduling.service import SchedulerService
from tests.support.asking import acquire
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model
from tests.support.loading import request


class LoaderDrainTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=4)

    def test_an_idle_loader_is_drained_at_once(self) -> None:
        self.successResultOf(self.loader.drain())
        error = self.failureResultOf(self.loader.acquire(request()), Unavailable).value
        self.assertEqual((error.code, error.retry_after), ("draining", 1.0))
        self.assertIn("draining", error.message)
        self.assertEqual(self.spawn.processes, [], "nothing is loaded for a refused request")

    def test_drained_once_the_served_and_the_queued_are_done(self) -> None:
        held_d = self.loader.acquire(request())
        queued_d = self.loader.acquire(request())  # parallel 1: waits for the slot
        self.spawn.processes[0].ready.callback(None)
        held = self.successResultOf(held_d)
        drained = self.loader.drain()
        self.assertNoResult(queued_d)
        self.failureResultOf(self.loader.acquire(request()), Unavailable)
        self.assertEqual(self.loader.in_flight, 2)
        held.release()
        self.assertNoResult(drained)
        queued = self.successResultOf(queued_d)  # accepted before the drain: still served
        queued.release()
        self.successResultOf(drained)
        self.assertEqual(self.loader.in_flight, 0)
        self.assertEqual(self.spawn.processes[0].stops, 0, "runners stay until the daemon stops")

    def test_a_waiter_that_leaves_counts_as_done(self) -> None:
        held_d = self.loader.acquire(request())
        queued_d = self.loader.acquire(request())
        self.spawn.processes[0].ready.callback(None)
        drained = self.loader.drain()
        queued_d.cancel()
        self.failureResultOf(queued_d, CancelledError)
        self.assertNoResult(drained)
        self.successResultOf(held_d).release()
        self.successResultOf(drained)


class StopDrainsTests(SynchronousTestCase):
    """SIGTERM (the service's stop) drains within [http] drain_timeout, then stops the runners."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.backend = FakeBackend()
        self.store = FakeStore({"ai/smollm2:latest": model()})
        self.scheduler = Scheduler(
            self.clock,
            Config(),
            {"llama.cpp": self.backend},
            self.store,
            self.spawn.start_runner,
        )
        self.scheduler.installer.start("llama.cpp")
        self.backend.installs[-1].callback("llama.cpp test")

    def serving(self):
        d = acquire(self.scheduler, self.store, None, "ai/smollm2", "completion")
        self.spawn.processes[0].ready.callback(None)
        return self.successResultOf(d)

    def service(self, timeout: float) -> SchedulerService:
        service = SchedulerService(self.scheduler, (), self.clock, timeout)
        service.running = True
        return service

    def test_stop_waits_for_the_answer_in_flight(self) -> None:
        lease = self.serving()
        stopped = self.service(30).stopService()
        self.assertTrue(self.scheduler.draining())
        self.failureResultOf(
            acquire(self.scheduler, self.store, None, "ai/smollm2", "completion"), Unavailable
        )
        self.clock.advance(29)
        self.assertEqual(self.spawn.processes[0].stops, 0, "the runner serves on while it drains")
        lease.release()
        self.assertEqual(self.spawn.processes[0].stops, 1)
        self.successResultOf(stopped)

    def test_stop_gives_up_on_the_drain_after_drain_timeout(self) -> None:
        self.serving()
        stopped = self.service(30).stopService()
        self.clock.advance(29)
        self.assertEqual(self.spawn.processes[0].stops, 0)
        self.clock.advance(1)
        self.assertEqual(self.spawn.processes[0].stops, 1)
        self.successResultOf(stopped)

    def test_no_drain_timeout_stops_at_once(self) -> None:
        self.serving()
        self.service(0).stopService()
        self.assertEqual(self.spawn.processes[0].stops, 1)
