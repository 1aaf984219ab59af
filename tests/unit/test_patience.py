"""Serve before swapping (L{patience}, C{order = "loaded"} in L{policy.plan}): cases, properties, and runs."""

from __future__ import annotations

import attrs
from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from mrunner.scheduling import patience, policy
from mrunner.scheduling.order import FIFO, LOADED, Rules
from mrunner.scheduling.policy import Limits, State
from tests.support.policy_views import Runner
from tests.support.scheduling_sim import Client, simulate

RULES = Rules(LOADED, max_wait=15.0, min_serve=1.0)


@attrs.frozen
class Waiter:
    key: str
    memory: int = 6
    since: float = 0.0
    priority: int = 1


def serving(in_use: int = 1, loaded_at: float = -100.0, load_seconds: float = 5.0, **kw: object) -> Runner:
    view = Runner(State.READY, in_use, 2, 0.0, 6, loaded_at=loaded_at, load_seconds=load_seconds)
    return attrs.evolve(view, **kw)


def idle(finished_at: float = 0.0, **kw: object) -> Runner:
    return serving(0, finished_at=finished_at, **kw)


BUSY = serving()


# (why, runners, queue as (key, since), now, expected assign/load/evict/drain)
CASES = [
    (
        "a busy runner is not drained for a waiter that is not overdue",
        {"a": BUSY},
        [("b", 0)],
        10,
        ("", "", "", ""),
    ),
    ("it is once the waiter has waited max_wait", {"a": BUSY}, [("b", 0)], 15, ("", "", "", "a")),
    (
        "an overdue waiter drains it before its newer own",
        {"a": BUSY},
        [("b", 0), ("a", 9)],
        16,
        ("", "", "", "a"),
    ),
    (
        "its own older ones go first; it drains once they have",
        {"a": BUSY},
        [("a", 0), ("b", 0)],
        16,
        ("a", "", "", ""),
    ),
    (
        "idle a moment between a client's requests: kept",
        {"a": idle(finished_at=9.5)},
        [("b", 0)],
        10,
        ("",) * 4,
    ),
    ("its own waiters keep it from draining", {"a": BUSY}, [("b", 5), ("a", 6)], 16, ("a", "", "", "")),
    ("an idle runner nobody asks for goes at once", {"a": idle()}, [("b", 0)], 1, ("", "", "a", "")),
    (
        "just loaded: it serves its load time before an overdue waiter drains it",
        {"a": serving(loaded_at=95, load_seconds=10)},
        [("b", 0)],
        100,
        ("", "", "", ""),
    ),
    (
        "and no longer",
        {"a": serving(loaded_at=95, load_seconds=10)},
        [("b", 0)],
        105,
        ("", "", "", "a"),
    ),
    (
        "never longer than max_wait, whatever its load took",
        {"a": serving(loaded_at=80, load_seconds=100)},
        [("b", 0)],
        95,
        ("", "", "", "a"),
    ),
    (
        "just loaded but idle and unasked for: it goes",
        {"a": idle(loaded_at=99, load_seconds=10)},
        [("b", 0)],
        100,
        ("", "", "a", ""),
    ),
    (
        "the idle one cheapest to bring back goes, not the least recently used",
        {
            "a": idle(finished_at=1, load_seconds=30, memory=4),
            "b": idle(finished_at=2, load_seconds=2, memory=4),
        },
        [("c", 99)],
        100,
        ("", "", "b", ""),
    ),
    (
        "a free slot is taken before an older waiter that needs a load",
        {"a": serving(in_use=1)},
        [("b", 0), ("a", 5)],
        10,
        ("a", "", "", ""),
    ),
]


class LoadedOrderTests(SynchronousTestCase):
    def test_cases(self) -> None:
        for why, runners, queue, now, expected in CASES:
            waiters = [Waiter(key, since=since) for key, since in queue]
            decision = policy.plan(waiters, runners, [], Limits(4, 10), now=now, rules=RULES)
            got = tuple(
                " ".join(w.key if isinstance(w, Waiter) else str(w) for w in part)
                for part in (decision.assign, decision.load, decision.evict, decision.drain)
            )
            self.assertEqual(got, expected, why)

    def test_overdue_does_not_reorder_one_models_waiters(self) -> None:
        """Patience weighs models against each other: one model's free slot goes to the queue's
        first (the better class), not to an overdue waiter behind it."""
        queue = [Waiter("a", since=55, priority=0), Waiter("a", since=0, priority=2)]
        decision = policy.plan(queue, {"a": BUSY}, [], Limits(4, 10), now=60, rules=RULES)
        self.assertEqual(decision.assign, (queue[0],))

    def test_fifo_drains_at_once(self) -> None:
        """Today's order, kept as C{order = "fifo"}: the first waiter that needs room drains for it."""
        decision = policy.plan([Waiter("b")], {"a": BUSY}, [], Limits(4, 10), now=1, rules=Rules(FIFO))
        self.assertEqual(decision.drain, ("a",))
        self.assertIsNone(decision.wake_at)

    def test_max_wait_zero_is_today(self) -> None:
        rules = Rules(LOADED, max_wait=0)
        decision = policy.plan([Waiter("b")], {"a": BUSY}, [], Limits(4, 10), now=1, rules=rules)
        self.assertEqual(decision.drain, ("a",))

    def test_wakes_when_the_waiter_is_overdue(self) -> None:
        decision = policy.plan([Waiter("b", since=3)], {"a": BUSY}, [], Limits(4, 10), now=4, rules=RULES)
        self.assertEqual(decision.wake_at, 18)

    def test_wakes_when_a_fresh_runner_may_go(self) -> None:
        runners = {"a": serving(loaded_at=100, load_seconds=4)}
        decision = policy.plan([Waiter("b", since=0)], runners, [], Limits(4, 10), now=101, rules=RULES)
        self.assertEqual(decision.wake_at, 104)

    def test_patience_by_class(self) -> None:
        """High waits half of max_wait, low twice; a low one promoted by starvation counts as normal."""
        rules = attrs.evolve(RULES, starvation=60)
        for rank, waited, expected in [(0, 0, 7.5), (1, 0, 15), (2, 0, 30), (2, 60, 15)]:
            waiter = Waiter("a", since=0, priority=rank)
            self.assertEqual(patience.patience(waiter, waited, rules), expected, (rank, waited))

    def test_eviction_order_weighs_use(self) -> None:
        """Of two equally slow loads, the one used more often stays; unmeasured ones go by size."""
        runners = {
            "often": idle(load_seconds=10, loaded_at=0, served=600),
            "seldom": idle(load_seconds=10, loaded_at=0, served=6),
            "small": Runner(State.READY, memory=2**20),
        }
        self.assertEqual(patience.eviction_order(runners, runners, {}, 600), ["small", "seldom", "often"])


waiting = st.builds(Waiter, st.sampled_from("abcd"), st.integers(0, 10), st.floats(0, 100), st.integers(0, 2))
runner_states = st.builds(
    Runner,
    state=st.sampled_from([State.LOADING, State.READY, State.DRAINING]),
    in_use=st.integers(0, 2),
    parallel=st.just(2),
    finished_at=st.floats(0, 100),
    memory=st.integers(0, 10),
    pinned=st.booleans(),
    loaded_at=st.floats(0, 100),
    load_seconds=st.floats(0, 60),
    served=st.integers(0, 100),
)


class LoadedPropertyTests(SynchronousTestCase):
    @settings(deadline=None)
    @given(
        st.dictionaries(st.sampled_from("abcd"), runner_states, max_size=4),
        st.lists(waiting, max_size=6),
        st.integers(1, 4),
        st.floats(0, 200),
        st.floats(0, 30),
    )
    def test_invariants(
        self, runners: dict[str, Runner], queue: list[Waiter], slots: int, now: float, max_wait: float
    ) -> None:
        """Today's invariants hold, and a runner that serves or is asked for is stopped only for an
        overdue waiter of another model."""
        rules = attrs.evolve(RULES, max_wait=max_wait)
        decision = policy.plan(queue, runners, [], Limits(slots, 10), now=now, rules=rules)
        kept = {key: r for key, r in runners.items() if key not in decision.evict}
        loads = {w.key: w.memory for w in decision.load}
        if loads:
            self.assertLessEqual(len(kept) + len(loads), slots)
            self.assertLessEqual(sum(r.memory for r in kept.values()) + sum(loads.values()), 10)
        overdue = {w.key for w in queue if patience.overdue(w, now, rules)}
        wanted = {w.key for w in queue}
        for key in decision.evict:
            self.assertEqual(runners[key].in_use, 0, "only idle runners are evicted")
        for key in (*decision.evict, *decision.drain):
            runner = runners[key]
            self.assertFalse(runner.pinned)
            if runner.in_use or key in wanted:
                self.assertTrue(overdue - {key}, "a runner that serves is stopped only for an overdue waiter")
                fresh = now < patience.protected_until(runner, rules)
                self.assertFalse(fresh, "nor before it has served its first while")

    @settings(max_examples=60, deadline=None)
    @example(  # max_wait 0: four clients' requests, each a swap, before the last one's
        [Client(("a",), 1.0, 2.0), Client(("a", "b"), 1.0), Client(("b",), 1.0), Client(("a",), 1.0)],
        3.0,
        3.0,
        0.0,
        0.0,
        1,
    )
    @given(
        st.lists(
            st.builds(
                Client,
                st.sampled_from([("a",), ("b",), ("a", "b")]),
                st.floats(0.2, 4),
                st.floats(0, 2),
            ),
            min_size=1,
            max_size=5,
        ),
        st.floats(0.5, 20),
        st.floats(0.5, 20),
        st.floats(0, 30),
        st.floats(0, 3),
        st.integers(1, 2),
    )
    def test_bounded_waits(
        self,
        clients: list[Client],
        load_a: float,
        load_b: float,
        max_wait: float,
        min_serve: float,
        parallel: int,
    ) -> None:
        """Whatever keeps coming for the loaded model, no request waits longer than max_wait, the
        loads in its way, and the requests served before it (one in flight on the runner in its
        way, and older ones); the budget holds and no busy runner is evicted.

        The loads in its way are three when C{max_wait} is long beside them (its own model's under
        way when it came, another's for an older overdue waiter, its own), but one for each
        client when it is short: every older request is then overdue too, and each may be for
        the other model (C{max_wait} 0 is FIFO's order)."""
        rules = Rules(LOADED, max_wait, min_serve)
        run = simulate(clients, {"a": load_a, "b": load_b}, rules, parallel)
        self.assertEqual(run.broken, [])
        longest = max(c.seconds for c in clients)
        # The requests in the way: the runner's own in flight, and older ones of its own clients'.
        loads = max(3, len(clients))
        bound = max_wait + loads * max(load_a, load_b) + (len(clients) + 1) * longest + 1e-6
        waits = run.waits + run.unserved
        self.assertLessEqual(
            max(waits, default=0), bound, (clients, load_a, load_b, max_wait, min_serve, parallel)
        )


class RunTests(SynchronousTestCase):
    """Two models that do not fit together, two clients on each: loads shared by many requests."""

    clients = [Client(("a",)), Client(("a",)), Client(("b",)), Client(("b",))]
    load = {"a": 5.0, "b": 5.0}

    def test_serve_before_swapping(self) -> None:
        run = simulate(self.clients, self.load, RULES, parallel=2, until=300)
        self.assertGreaterEqual(
            run.served / run.loads, 10, "a swap every 15 s or so, of 1 s requests two at once"
        )
        self.assertLessEqual(max(run.waits), 15 + 5 + 5 + 1 + 1e-6)

    def test_fifo_swaps_all_the_time(self) -> None:
        run = simulate(self.clients, self.load, Rules(FIFO), parallel=2, until=300)
        self.assertLess(run.served / run.loads, 4)
