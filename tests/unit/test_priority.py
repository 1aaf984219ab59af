"""The queue's order by priority class: named cases, hypothesis invariants, and the loader using it."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import Unavailable
from mrunner.scheduling import priority
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.policy import Limits
from tests.support.fakes import FakeSpawner
from tests.support.loading import request

HIGH, NORMAL, LOW = 0, 1, 2


@attrs.frozen
class W:
    name: str
    priority: int
    since: float


CASES = [
    # (name, queue in arrival order as (name, class, since), now, starvation, expected order)
    ("one class keeps arrival order", [("a", 1, 0), ("b", 1, 1), ("c", 1, 2)], 3, 60, "abc"),
    ("high before normal before low", [("l", 2, 0), ("n", 1, 1), ("h", 0, 2)], 3, 60, "hnl"),
    (
        "first come first served within a class",
        [("l1", 2, 0), ("h1", 0, 1), ("l2", 2, 2), ("h2", 0, 3)],
        4,
        60,
        ["h1", "h2", "l1", "l2"],
    ),
    (
        "a low starved one period is normal, after the normals that came first",
        [("n", 1, 0), ("l", 2, 1), ("n2", 1, 30)],
        62,
        60,
        ["n", "l", "n2"],
    ),
    ("a low starved two periods is high", [("l", 2, 0), ("h", 0, 100)], 121, 60, ["l", "h"]),
    ("not yet starved", [("l", 2, 0), ("h", 0, 50)], 59, 60, ["h", "l"]),
    ("starvation 0: classes only", [("l", 2, 0), ("h", 0, 5)], 10_000, 0, ["h", "l"]),
]


class OrderTests(SynchronousTestCase):
    def test_cases(self) -> None:
        for name, queue, now, starvation, expected in CASES:
            waiters = [W(*entry) for entry in queue]
            ordered = [w.name for w in priority.order(waiters, now, starvation)]
            self.assertEqual(ordered, list(expected), name)
            first = priority.first(waiters, now, starvation)
            self.assertEqual(first.name if first else None, next(iter(expected)), name)

    def test_empty(self) -> None:
        self.assertEqual(priority.order([], 0, 60), [])
        self.assertIsNone(priority.first([], 0, 60))

    @given(
        st.lists(st.tuples(st.integers(0, 2), st.floats(0, 1000)), max_size=30),
        st.floats(0, 2000),
        st.floats(0.5, 500),
    )
    def test_invariants(self, entries: list[tuple[int, float]], later: float, starvation: float) -> None:
        """A permutation; within a class arrival order is kept; the first is L{order}'s first; and a
        waiter that has waited its class times C{starvation} is served before any that came after it."""
        entries.sort(key=lambda e: e[1])  # arrival order
        waiters = [W(str(i), cls, since) for i, (cls, since) in enumerate(entries)]
        now = (entries[-1][1] if entries else 0) + later
        ordered = priority.order(waiters, now, starvation)
        self.assertEqual(sorted(w.name for w in ordered), sorted(w.name for w in waiters))
        for cls in (HIGH, NORMAL, LOW):
            mine = [w for w in ordered if w.priority == cls]
            self.assertEqual(mine, [w for w in waiters if w.priority == cls])
        first = priority.first(waiters, now, starvation)
        self.assertEqual(first, ordered[0] if ordered else None)
        position = {w.name: i for i, w in enumerate(ordered)}
        for i, w in enumerate(waiters):
            if now - w.since >= w.priority * starvation:  # top class by now: nobody later goes first
                for later_one in waiters[i + 1 :]:
                    self.assertLess(position[w.name], position[later_one.name])


class LoaderPriorityTests(SynchronousTestCase):
    """One runner with one slot: the next free slot goes to the best class waiting, then by arrival."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=10, starvation=60)
        first = self.loader.acquire(request())
        self.spawn.processes[0].ready.callback(None)
        self.held = self.successResultOf(first)

    def test_high_overtakes_queued_low(self) -> None:
        low = [self.loader.acquire(request(), LOW) for _ in range(2)]
        self.clock.advance(1)
        high = self.loader.acquire(request(), HIGH)
        self.held.release()
        self.assertNoResult(low[0])
        lease = self.successResultOf(high)
        lease.release()
        self.successResultOf(low[0]).release()
        self.successResultOf(low[1])

    def test_starved_low_is_served(self) -> None:
        low = self.loader.acquire(request(), LOW)
        for _ in range(3):  # highs keep coming, each served before the low until it has starved
            self.clock.advance(50)
            high = self.loader.acquire(request(), HIGH)
            self.held.release()
            if low.called:
                break
            self.held = self.successResultOf(high)
        self.successResultOf(low)
        self.assertEqual(self.clock.seconds(), 150, "two starvation periods make a low one high")

    def test_a_new_plan_serves_by_class_too(self) -> None:
        """A loading runner's waiters are served in class order when it becomes ready."""
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=10)
        got: list[str] = []
        for name, rank in (("low", LOW), ("high", HIGH)):
            self.loader.acquire(request("b"), rank).addCallback(lambda lease, n=name: got.append(n))
        self.assertEqual(got, [])
        self.spawn.processes[-1].ready.callback(None)
        self.assertEqual(got, ["high"])


DISPLACED = [
    # (name, queue as (name, class, since), the newcomer's class, now, starvation, turned away)
    ("a high takes the newest low's place", [("l1", 2, 0), ("l2", 2, 1), ("n", 1, 2)], HIGH, 3, 60, "l2"),
    ("a normal takes a low's place", [("l", 2, 0), ("h", 0, 1)], NORMAL, 2, 60, "l"),
    ("the same class waits its turn: no one", [("l1", 2, 0), ("l2", 2, 1)], LOW, 2, 60, None),
    ("a better class is never turned away", [("h", 0, 0), ("n", 1, 1)], LOW, 2, 60, None),
    ("a low promoted by its wait keeps its place", [("l", 2, 0), ("n", 1, 100)], NORMAL, 130, 60, None),
    ("an empty queue: no one", [], HIGH, 0, 60, None),
]


class DisplacedTests(SynchronousTestCase):
    def test_cases(self) -> None:
        for name, queue, rank, now, starvation, expected in DISPLACED:
            waiters = [W(*entry) for entry in queue]
            turned = priority.displaced(waiters, rank, now, starvation)
            self.assertEqual(turned.name if turned else None, expected, name)

    def test_lows_do_not_shut_out_highs(self) -> None:
        """Issue 35 A8: max_queue = 10, one slot held, fourteen lows, then three highs: the highs wait
        (and are served first); the lows that came last are turned away with the queue-full 503."""
        spawn = FakeSpawner()
        loader = Loader(Clock(), spawn, Limits(1), max_queue=10, starvation=60)
        first = loader.acquire(request())
        spawn.processes[0].ready.callback(None)
        held = self.successResultOf(first)
        lows = [loader.acquire(request(), LOW) for _ in range(14)]
        full = [self.failureResultOf(d, Unavailable).value for d in lows[10:]]
        self.assertEqual({e.code for e in full}, {"queue_full"})
        highs = [loader.acquire(request(), HIGH) for _ in range(3)]
        for d in highs:
            self.assertNoResult(d)
        turned = [self.failureResultOf(d, Unavailable).value for d in lows[7:10]]
        self.assertEqual({e.code for e in turned}, {"queue_full"})
        self.assertIn("higher priority", turned[0].message)
        self.assertEqual(loader.queued, 10)
        held.release()
        self.successResultOf(highs[0]).release()
        self.successResultOf(highs[1]).release()
        self.successResultOf(highs[2]).release()
        self.successResultOf(lows[0])
        for d in lows[1:7]:
            self.assertNoResult(d)
