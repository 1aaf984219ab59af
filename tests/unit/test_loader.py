"""The loader's rules with a Clock and fake processes: sharing, limits, queue, eviction, back-off."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import RunnerFailed, Unavailable
from mrunner.runners.holding import MEASURE_EVERY
from mrunner.runners.request import LoadRequest
from mrunner.scheduling import policy
from mrunner.scheduling.lease import Lease
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.policy import Limits, State
from mrunner.values.backend import COMPLETION, EMBEDDING
from tests.support.fakes import FakeSpawner
from tests.support.loading import request


class LoaderTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.loader = Loader(self.clock, self.spawn, Limits(2), max_queue=4)

    def ready(self, index: int = -1) -> None:
        self.spawn.processes[index].ready.callback(None)

    def lease(self, d) -> Lease:
        return self.successResultOf(d)

    def state(self, name: str) -> State:
        return self.loader.runners[request(name).key].state

    def test_concurrent_requests_share_one_load(self) -> None:
        self.loader = Loader(self.clock, self.spawn, Limits(2), max_queue=20)
        waiting = [self.loader.acquire(request(parallel=20)) for _ in range(20)]
        self.assertEqual(len(self.spawn.processes), 1)
        for d in waiting:
            self.assertNoResult(d)
        self.ready()
        leases = [self.lease(d) for d in waiting]
        self.assertEqual({lease.socket for lease in leases}, {"/run/r0.sock"})
        self.assertEqual(self.loader.runners[request().key].in_use, 20)

    def test_parallel_slots(self) -> None:
        first, second, third = (self.loader.acquire(request(parallel=2)) for _ in range(3))
        self.ready()
        self.lease(first)
        lease = self.lease(second)
        self.assertNoResult(third)
        lease.release()
        self.lease(third)

    def test_release_is_once(self) -> None:
        d1, d2 = self.loader.acquire(request()), self.loader.acquire(request())
        self.ready()
        lease = self.lease(d1)
        lease.release()
        lease.release()
        self.lease(d2)
        self.assertEqual(self.loader.runners[request().key].in_use, 1)

    def test_leases_released_as_soon_as_handed_out(self) -> None:
        waiting = [self.loader.acquire(request()) for _ in range(3)]
        for d in waiting:
            d.addCallback(lambda lease: lease.release())
        self.ready()
        for d in waiting:
            self.successResultOf(d)
        self.assertEqual(self.loader.runners[request().key].in_use, 0)

    def test_modes_are_different_runners(self) -> None:
        self.loader.acquire(request(mode=COMPLETION))
        self.loader.acquire(request(mode=EMBEDDING))
        self.assertEqual(len(self.spawn.processes), 2)

    def test_evicts_least_recently_finished_idle_runner(self) -> None:
        leases = {}
        for name in "ab":
            d = self.loader.acquire(request(name))
            self.ready()
            leases[name] = self.lease(d)
        leases["b"].release()
        self.clock.advance(1)
        leases["a"].release()
        waiting = self.loader.acquire(request("c"))
        self.assertEqual(self.spawn.processes[1].stops, 1, "b finished first, so b goes")
        self.assertEqual(self.spawn.processes[0].stops, 0)
        self.assertEqual(len(self.spawn.processes), 3)
        self.ready()
        self.lease(waiting)

    def test_never_kills_a_busy_runner(self) -> None:
        leases = []
        for name in "ab":
            d = self.loader.acquire(request(name))
            self.ready()
            leases.append(self.lease(d))
        waiting = self.loader.acquire(request("c"))
        self.assertNoResult(waiting)
        self.assertEqual([p.stops for p in self.spawn.processes], [0, 0])
        self.assertEqual(self.state("a"), State.DRAINING, "a, the older, makes room for c")
        self.assertEqual(self.state("b"), State.READY)
        leases[1].release()
        self.assertEqual(self.spawn.processes[1].stops, 0, "b is idle but a is already making room")
        leases[0].release()
        self.assertEqual(self.spawn.processes[0].stops, 1)
        self.ready()
        self.lease(waiting)

    def test_a_draining_runner_takes_no_new_request(self) -> None:
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=4)
        d = self.loader.acquire(request("a", parallel=2))
        self.ready()
        held = self.lease(d)
        waiting_b = self.loader.acquire(request("b"))
        waiting_a = self.loader.acquire(request("a", parallel=2))
        self.assertNoResult(waiting_a)
        held.release()
        self.ready()
        self.lease(waiting_b).release()
        self.ready()
        self.lease(waiting_a)
        self.assertEqual([key.model[-1] for key in self.spawn.keys], ["a", "b", "a"])

    def test_new_load_waits_for_the_evicted_process_to_exit(self) -> None:
        d = self.loader.acquire(request("a"))
        self.ready()
        self.lease(d).release()
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=4)
        d = self.loader.acquire(request("a"))
        self.ready()
        self.lease(d).release()
        process = self.spawn.processes[-1]
        process.exits_on_stop = False
        self.loader.acquire(request("b"))
        self.assertEqual(process.stops, 1)
        spawned = len(self.spawn.processes)
        self.loader.acquire(request("c"))
        self.assertEqual(len(self.spawn.processes), spawned, "no load until the slot is free")
        process.exit()
        self.assertEqual(len(self.spawn.processes), spawned + 1)

    def test_queue_full(self) -> None:
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=2)
        self.loader.acquire(request())
        self.loader.acquire(request())
        error = self.failureResultOf(self.loader.acquire(request()), Unavailable).value
        self.assertEqual(error.code, "queue_full")
        self.assertIsNotNone(error.retry_after)

    def test_ready_runner_with_room_skips_a_full_queue(self) -> None:
        self.loader = Loader(self.clock, self.spawn, Limits(2), max_queue=1)
        d = self.loader.acquire(request("a", parallel=2))
        self.ready()
        held = self.lease(d)
        self.loader.acquire(request("b"))  # queued while b loads
        self.lease(self.loader.acquire(request("a", parallel=2)))
        held.release()

    def test_cancelled_waiter_leaves_the_queue(self) -> None:
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=1)
        waiting = self.loader.acquire(request())
        waiting.cancel()
        self.failureResultOf(waiting, CancelledError)
        self.assertEqual(self.loader.queued, 0)
        other = self.loader.acquire(request())
        self.ready()
        self.lease(other)
        self.assertEqual(len(self.spawn.processes), 1, "the load is not cancelled")

    def test_keep_alive_expiry(self) -> None:
        d = self.loader.acquire(request(keep_alive=10))
        self.ready()
        lease = self.lease(d)
        self.clock.advance(20)
        self.assertEqual(self.spawn.processes[0].stops, 0, "busy runners do not expire")
        lease.release()
        self.clock.advance(9)
        again = self.lease(self.loader.acquire(request(keep_alive=10)))
        again.release()
        self.clock.advance(9)
        self.assertEqual(self.spawn.processes[0].stops, 0, "the timer restarts on each finish")
        self.clock.advance(1)
        self.assertEqual(self.spawn.processes[0].stops, 1)
        self.assertEqual(self.loader.runners, {})

    def test_keep_alive_zero_and_never(self) -> None:
        d = self.loader.acquire(request("a", keep_alive=0))
        self.ready()
        self.lease(d).release()
        self.assertEqual(self.spawn.processes[0].stops, 1)
        d = self.loader.acquire(request("b", keep_alive=-1))
        self.ready()
        self.lease(d).release()
        self.clock.advance(10**6)
        self.assertEqual(self.spawn.processes[1].stops, 0)

    def test_a_request_keep_alive_replaces_the_runners(self) -> None:
        d = self.loader.acquire(request(keep_alive=10))
        self.ready()
        self.lease(d).release()
        asked = attrs.evolve(request(keep_alive=60), sets_keep_alive=True)
        self.lease(self.loader.acquire(asked)).release()
        self.clock.advance(59)
        self.lease(self.loader.acquire(request(keep_alive=10))).release()
        self.clock.advance(59)
        self.assertEqual(self.spawn.processes[0].stops, 0, "60 s holds for the requests after it")
        self.clock.advance(1)
        self.assertEqual(self.spawn.processes[0].stops, 1)

    def test_a_runner_that_exits_while_serving_gets_no_keep_alive(self) -> None:
        d = self.loader.acquire(request())
        self.ready()
        lease = self.lease(d)
        self.spawn.processes[0].exit()
        lease.release()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.loader.runners, {})

    def test_exited_runner_is_evicted_and_reloaded(self) -> None:
        d = self.loader.acquire(request())
        self.ready()
        lease = self.lease(d)
        self.spawn.processes[0].exit()
        self.assertEqual(self.loader.runners, {})
        lease.release()
        d = self.loader.acquire(request())
        self.assertEqual(len(self.spawn.processes), 2)
        self.ready()
        self.lease(d)

    def test_load_failure_fails_waiters_and_backs_off(self) -> None:
        waiting = [self.loader.acquire(request()) for _ in range(3)]
        self.spawn.processes[0].ready.errback(RunnerFailed("boom: stderr tail"))
        self.spawn.processes[0].exit()
        for d in waiting:
            self.assertEqual(self.failureResultOf(d, RunnerFailed).value.message, "boom: stderr tail")
        delays = []
        for expected in (1, 2, 4):
            error = self.failureResultOf(self.loader.acquire(request()), Unavailable).value
            self.assertAlmostEqual(error.retry_after, expected)
            delays.append(error.retry_after)
            self.clock.advance(expected)
            retry = self.loader.acquire(request())
            self.spawn.processes[-1].ready.errback(RunnerFailed("again"))
            self.spawn.processes[-1].exit()
            self.failureResultOf(retry, RunnerFailed)
        self.clock.advance(8)
        d = self.loader.acquire(request())
        self.ready()
        self.lease(d).release()
        self.spawn.processes[-1].exit()
        self.loader.acquire(request())
        self.assertEqual(self.loader.queued, 1, "success resets the back-off")

    def test_backoff_is_capped(self) -> None:
        from mrunner.scheduling.backoff import next_backoff

        delay = None
        for _ in range(10):
            delay = next_backoff(delay)
        self.assertEqual(delay, 60)

    def test_unload_drains_busy_runners(self) -> None:
        d = self.loader.acquire(request())
        self.ready()
        lease = self.lease(d)
        self.successResultOf(self.loader.unload(lambda key: True))
        self.assertEqual(self.spawn.processes[0].stops, 0)
        self.assertEqual(self.state("a"), State.DRAINING)
        waiting = self.loader.acquire(request())
        lease.release()
        self.assertEqual(self.spawn.processes[0].stops, 1)
        self.assertEqual(len(self.spawn.processes), 2, "a draining runner takes no new work")
        self.ready()
        self.lease(waiting)

    def test_close_fails_waiters_and_stops_everything(self) -> None:
        d = self.loader.acquire(request("a"))
        self.ready()
        self.lease(d)
        loading = self.loader.acquire(request("b"))
        closed = self.loader.close()
        self.successResultOf(closed)
        self.failureResultOf(loading)
        self.assertEqual([p.stops for p in self.spawn.processes], [1, 1])
        self.failureResultOf(self.loader.acquire(request("a")), Unavailable)


class MemoryBudgetTests(SynchronousTestCase):
    """Runners fit a memory budget: idle ones are evicted for room, busy ones never."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.loader = Loader(self.clock, self.spawn, Limits(max_runners=8, memory_budget=10), max_queue=8)

    def hold(self, name: str, memory: int) -> Lease:
        d = self.loader.acquire(request(name, memory=memory))
        self.spawn.processes[-1].ready.callback(None)
        return self.successResultOf(d)

    def test_evicts_as_many_idle_runners_as_it_takes(self) -> None:
        for name, memory in (("a", 3), ("b", 3), ("c", 3)):
            self.hold(name, memory).release()
            self.clock.advance(1)
        waiting = self.loader.acquire(request("d", memory=7))
        self.assertEqual([p.stops for p in self.spawn.processes[:3]], [1, 1, 0], "a and b free 6; 1 was free")
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(waiting)

    def test_waits_for_busy_runners(self) -> None:
        held = self.hold("a", 6)
        waiting = self.loader.acquire(request("b", memory=6))
        self.assertNoResult(waiting)
        self.assertEqual(len(self.spawn.processes), 1, "no load while a busy runner holds the memory")
        self.assertEqual(self.spawn.processes[0].stops, 0)
        held.release()
        self.assertEqual(self.spawn.processes[0].stops, 1)
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(waiting)

    def test_small_models_share_the_budget(self) -> None:
        self.hold("a", 4)
        self.hold("b", 4)
        self.assertEqual([p.stops for p in self.spawn.processes], [0, 0])

    def test_measured_memory_counts_when_larger(self) -> None:
        lease = self.hold("a", 2)
        runner = self.loader.runners[request("a").key]
        self.spawn.processes[0].resident = 9
        lease.release()
        self.assertEqual(runner.memory, 2, "measured when ready, and not again within a second")
        self.clock.advance(MEASURE_EVERY)
        self.successResultOf(self.loader.acquire(request("a", memory=2))).release()
        self.assertEqual(runner.memory, 9)
        self.loader.acquire(request("b", memory=2))
        self.assertEqual(self.spawn.processes[0].stops, 1, "a really uses 9 of 10: it makes room")

    def test_fifo_for_memory(self) -> None:
        held = self.hold("a", 8)
        self.loader.acquire(request("b", memory=8))
        self.loader.acquire(request("c", memory=1))
        self.assertEqual(len(self.spawn.processes), 1, "the small one does not pass the big one")
        held.release()
        loaded = [key.model[-1] for key in self.spawn.keys]
        self.assertEqual(loaded, ["a", "b", "c"], "a made room for both, 8 + 1 of 10, in order")


class PinTests(SynchronousTestCase):
    """A pinned runner never expires and is never stopped for room; it still counts."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=4)

    def load(self, req: LoadRequest) -> None:
        d = self.loader.acquire(req)
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(d).release()

    def test_never_expires_until_unpinned(self) -> None:
        self.load(attrs.evolve(request(keep_alive=10), pinned=True))
        self.clock.advance(10**6)
        self.assertEqual(self.spawn.processes[0].stops, 0)
        self.loader.pin(lambda key: True, False)
        self.clock.advance(10)
        self.assertEqual(self.spawn.processes[0].stops, 1, "its keep-alive runs again from now")

    def test_never_evicted(self) -> None:
        self.load(attrs.evolve(request("a"), pinned=True))
        waiting = self.loader.acquire(request("b"))
        self.assertNoResult(waiting)
        self.assertEqual([p.stops for p in self.spawn.processes], [0], "b waits: the only slot is pinned")
        self.successResultOf(self.loader.unload(lambda key: True))
        self.assertEqual(self.spawn.processes[0].stops, 1, "an explicit unload still stops it")
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(waiting)

    def test_fits(self) -> None:
        self.assertTrue(self.loader.fits(0))
        self.load(request("a"))
        self.assertFalse(self.loader.fits(0), "no slot left")


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "ready", "fail", "exit", "release", "unload", "pin", "tick"]),
        st.integers(0, 3),
    ),
    max_size=40,
)


class LifecyclePropertyTests(SynchronousTestCase):
    """In any order of events, the loader makes only the lifecycle's moves and its records agree."""

    @settings(max_examples=200, deadline=None)
    @given(ACTIONS)
    def test_any_sequence(self, actions: list[tuple[str, int]]) -> None:
        clock = Clock()
        spawn = FakeSpawner()
        loader = Loader(clock, spawn, Limits(2, memory_budget=10), max_queue=4)
        leases: list[Lease] = []
        for action, n in actions:
            name = "abcd"[n]
            process = spawn.processes[n % len(spawn.processes)] if spawn.processes else None
            if action == "acquire":
                d = loader.acquire(request(name, keep_alive=n, memory=4, parallel=2))
                d.addCallbacks(leases.append, lambda failure: None)
            elif action == "ready" and process is not None and not process.ready.called:
                process.ready.callback(None)
            elif action == "fail" and process is not None and not process.ready.called:
                process.ready.errback(RunnerFailed("no"))
            elif action == "exit" and process is not None:
                process.exit()
            elif action == "release" and leases:
                leases.pop(n % len(leases)).release()
            elif action == "unload":
                model = request(name).key.model
                loader.unload(lambda key, model=model: key.model == model)
            elif action == "pin":
                loader.pin(lambda key: True, n % 2 == 0)
            elif action == "tick":
                clock.advance(n)
            for key, runner in loader.runners.items():
                self.assertEqual(runner.key, key)
                self.assertIn(runner.state, (State.LOADING, State.READY, State.DRAINING))
            for p in spawn.processes:
                # Each runner's machine took what its process told it: a move it refused would
                # have left its IllegalMove in the Deferred.
                for d in (p.ready, p.ended):
                    self.assertFalse(d.called and isinstance(d.result, Failure), d)
            stopping = loader.roster.stopping()
            self.assertLessEqual(len(loader.runners) + len(stopping), 2)
            # Nothing is left undone: no waiter could take a free slot or start a load now.
            memory = [runner.memory for runner in stopping]
            now = policy.plan(loader._queue, loader.runners, memory, loader._limits)
            self.assertEqual((now.assign, now.load), ((), ()))
        for lease in leases:
            lease.release()
        self.successResultOf(loader.close())
        self.assertEqual((loader.runners, loader.roster.stopping()), ({}, []))
        self.successResultOf(loader.roster.when_empty())
