"""The queue's order as an object (L{order}), the loader's gate (L{gate}) and its bounded queue
(L{waitqueue}): each part alone, without a loader."""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import Unavailable
from mrunner.scheduling.gate import Gate
from mrunner.scheduling.order import BY_NAME, DEFAULT, FIFO, LOADED
from mrunner.scheduling.waitqueue import WaitQueue
from mrunner.values import State
from tests.support.policy_views import Runner


@attrs.define(eq=False)
class Waiter:
    key: str
    priority: int = 1
    since: float = 0.0
    deferred: Deferred[Any] = attrs.Factory(Deferred)


class OrderTests(SynchronousTestCase):
    def test_chosen_by_the_configuration_name(self) -> None:
        self.assertEqual(dict(BY_NAME), {"fifo": FIFO, "loaded": LOADED})
        self.assertIs(DEFAULT.order, FIFO, "the rules' default order")

    def test_a_freed_slot_goes_to_the_head_under_fifo_always(self) -> None:
        self.assertTrue(FIFO.hands_on(["a", "b"], "a"))
        self.assertTrue(LOADED.hands_on(["a", "a"], "a"))
        self.assertFalse(LOADED.hands_on(["a", "b"], "a"), "b's waiter may be overdue")

    def test_costs_weighed_only_under_loaded(self) -> None:
        runners = {
            "a": Runner(State.READY, 0, 1, 0.0, 6, load_seconds=4.0),
            "b": Runner(State.READY, 0, 1, 0.0, 6, load_seconds=2.0),
        }
        measured = {"a": 9.0}.get
        self.assertEqual(FIFO.costs(runners, measured), {})
        self.assertEqual(LOADED.costs(runners, measured), {"a": 9.0, "b": 2.0})


class GateTests(SynchronousTestCase):
    def test_open_draining_closed(self) -> None:
        gate = Gate()
        gate.admit()
        gate.drain(queued=0)
        self.assertEqual(self.assertRaises(Unavailable, gate.admit).code, "draining")
        gate.closed = True
        self.assertEqual(self.assertRaises(Unavailable, gate.admit).code, "shutting_down")

    def test_a_drain_fires_once_nothing_waits_or_is_served(self) -> None:
        gate = Gate()
        gate.leased = 1
        done = gate.drain(queued=1)
        gate.settle(queued=0)
        self.assertNoResult(done)
        gate.leased = 0
        gate.settle(queued=0)
        self.assertIsNone(self.successResultOf(done))


class WaitQueueTests(SynchronousTestCase):
    def test_full_at_its_limit(self) -> None:
        queue = WaitQueue(1)
        self.assertFalse(queue.full)
        queue.append(Waiter("a"))
        self.assertTrue(queue.full)

    def test_ahead_counts_better_classes_and_earlier_arrivals(self) -> None:
        queue = WaitQueue(10)
        early, high, mine = Waiter("a", since=1), Waiter("b", priority=0, since=5), Waiter("a", since=3)
        queue.extend([early, high, mine, Waiter("c", since=4)])
        self.assertEqual(queue.ahead(mine.deferred), 2)
        self.assertIsNone(queue.ahead(Deferred()))

    def test_make_way_turns_away_the_last_of_a_worse_class(self) -> None:
        queue = WaitQueue(2)
        first, last = Waiter("a", priority=2), Waiter("b", priority=2, since=1)
        queue.extend([first, last])
        self.assertFalse(queue.make_way(2, now=1, starvation=60), "not for the same class")
        self.assertTrue(queue.make_way(1, now=1, starvation=60))
        self.assertEqual(list(queue), [first])
        self.assertEqual(self.failureResultOf(last.deferred, Unavailable).value.code, "queue_full")

    def test_fail_and_close(self) -> None:
        queue = WaitQueue(10)
        a, b = Waiter("a"), Waiter("b")
        queue.extend([a, b])
        queue.fail("a", Unavailable("gone"))
        self.assertEqual(list(queue), [b])
        self.failureResultOf(a.deferred, Unavailable)
        queue.close()
        self.assertEqual(self.failureResultOf(b.deferred, Unavailable).value.code, "shutting_down")
