"""A queued request whose client hangs up lets go of its body at once, with no garbage collection
(issue 53 M1: each queued body stayed 3 to 5 times over in reference cycles until a full one)."""

from __future__ import annotations

import gc
import json
import tracemalloc
import weakref
from pathlib import Path
from typing import Any, cast

import attrs
from twisted.internet.address import IPv4Address
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.door.released import released
from mrunner.api.door.routing import Routes
from mrunner.api.door.site import GatedSite
from mrunner.config import Config, SchedulerConfig
from mrunner.daemon.metrics import Metrics
from mrunner.scheduling.facade import Scheduler
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model
from tests.support.route_groups import daemon_groups

BIG = 4 * 2**20
CHAT = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "x" * BIG}]}).encode()


def without_collection(test: SynchronousTestCase) -> None:
    """Garbage collection off for the rest of C{test}, after one, so nothing is freed but by its count."""
    gc.collect()
    gc.disable()
    test.addCleanup(gc.enable)


class HangUpTests(SynchronousTestCase):
    def setUp(self) -> None:
        clock = Clock()
        backend = FakeBackend()
        store = FakeStore({"ai/smollm2:latest": model()})
        scheduler_config = SchedulerConfig(install_wait=5, max_queue=8, max_runners=1, parallel=1)
        config = attrs.evolve(Config(), scheduler=scheduler_config, max_request_bytes=2 * BIG)
        metrics = Metrics()
        backends = {"llama.cpp": backend}
        scheduler = Scheduler(clock, config, backends, store, FakeSpawner().start_runner, events=metrics)
        metrics.watch(scheduler)
        groups = daemon_groups(scheduler, store, clock, backends, Path(self.mktemp()), 2 * BIG, metrics)
        scheduler.start()
        backend.installs[-1].callback("llama.cpp test")
        self.site = GatedSite(Routes(groups), config, clock)
        self.site.doStart()
        self.addCleanup(self.site.doStop)

    def hung_up(self, path: bytes, body: bytes) -> weakref.ref[Any]:
        """Send C{body} to C{path}, where it waits for a runner that is still starting, then hang up;
        the request, weakly."""
        host, peer = IPv4Address("TCP", "127.0.0.1", 12434), IPv4Address("TCP", "127.0.0.1", 40000)
        transport = StringTransport(hostAddress=host, peerAddress=peer)
        channel = self.site.buildProtocol(None)
        channel.makeConnection(transport)
        head = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % (path, len(body))
        channel.dataReceived(head + body)
        self.assertEqual(transport.value(), b"", "it waits")
        [request] = channel.requests
        transport.producer = None  # as a TCP or UNIX transport does before it tells its protocol
        channel.connectionLost(Failure(ConnectionDone()))
        return weakref.ref(request)

    def freed(self, path: bytes) -> weakref.ref[Any]:
        """Hang up on a request to C{path} waiting in the queue: its body is freed at once; the request,
        weakly."""
        without_collection(self)
        tracemalloc.start()
        self.addCleanup(tracemalloc.stop)
        before = tracemalloc.get_traced_memory()[0]
        request = self.hung_up(path, CHAT)
        self.assertLess(tracemalloc.get_traced_memory()[0] - before, BIG / 8, "its body is freed")
        return request

    def test_a_hot_routes_request_is_freed_with_no_cycle_left(self) -> None:
        self.assertIsNone(self.freed(b"/v1/chat/completions")(), "the request is freed")
        self.assertEqual(gc.collect(), 0, "with no cycle left to collect")

    def test_a_klein_routes_body_is_freed(self) -> None:
        """Klein's own error path keeps the request in a cycle (a closure that calls itself), without
        its body."""
        self.freed(b"/engines/llama.cpp/v1/chat/completions")


class ReleasedTests(SynchronousTestCase):
    def test_a_cancelled_routes_frames_let_go_of_their_locals(self) -> None:
        without_collection(self)
        waiting: Deferred[None] = Deferred()

        class Held:
            pass

        async def inner(held: Held) -> None:
            await waiting

        @released
        async def route(held: Held) -> None:
            await ensureDeferred(inner(held))

        held = Held()
        alive = weakref.ref(held)
        d = cast(Deferred[None], route(held))  # a coroutine, once released: a Deferred
        del held
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertIsNone(alive())

    def test_other_results_pass_through(self) -> None:
        self.assertEqual(released(lambda: b"answer")(), b"answer")
        self.assertEqual(self.successResultOf(released(lambda: Deferred.fromCoroutine(_one()))()), 1)


async def _one() -> int:
    return 1
