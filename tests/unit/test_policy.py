"""The fit, eviction and drain decisions of L{policy.plan}, as a table of cases."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from mrunner.scheduling import policy
from mrunner.scheduling.policy import Limits, State
from tests.support.policy_views import Runner


@attrs.frozen
class Waiter:
    key: str
    memory: int = 0
    pinned: bool = False


def ready(memory: int, finished_at: float = 0.0, in_use: int = 0, parallel: int = 1) -> Runner:
    return Runner(State.READY, in_use, parallel, finished_at, memory)


def busy(memory: int, finished_at: float = 0.0) -> Runner:
    return ready(memory, finished_at, in_use=1)


LOADING = Runner(State.LOADING, memory=4)


def pinned(runner: Runner) -> Runner:
    return attrs.evolve(runner, pinned=True)


# (why, runners, queue as "key:memory", stopping, limits, expected assign/load/evict/drain)
CASES = [
    ("a free slot serves at once", {"a": ready(4)}, ["a"], [], Limits(1, 10), ("a", "", "", "")),
    (
        "a model that fits loads beside",
        {"a": ready(4)},
        ["b:4"],
        [],
        Limits(2, 10),
        ("", "b", "", ""),
    ),
    ("no budget: only slots count", {"a": ready(40)}, ["b:40"], [], Limits(2), ("", "b", "", "")),
    (
        "out of slots: the idle one goes",
        {"a": ready(1)},
        ["b:1"],
        [],
        Limits(1, 10),
        ("", "", "a", ""),
    ),
    (
        "least recently finished goes first",
        {"a": ready(4, 2.0), "b": ready(4, 1.0)},
        ["c:4"],
        [],
        Limits(3, 10),
        ("", "", "b", ""),
    ),
    (
        "as many idle ones as it takes",
        {"a": ready(3, 1.0), "b": ready(3, 2.0), "c": ready(3, 3.0)},
        ["d:7"],
        [],
        Limits(8, 10),
        ("", "", "a b", ""),
    ),
    (
        "idle ones go before busy ones drain",
        {"a": busy(5, 1.0), "b": ready(5, 2.0)},
        ["c:5"],
        [],
        Limits(8, 10),
        ("", "", "b", ""),
    ),
    (
        "a busy one that holds the memory drains",
        {"a": busy(6)},
        ["b:6"],
        [],
        Limits(8, 10),
        ("", "", "", "a"),
    ),
    (
        "a runner handed a waiter ahead of the blocked one drains after serving it",
        {"a": ready(6)},
        ["a", "b:6"],
        [],
        Limits(8, 10),
        ("a", "", "", "a"),
    ),
    (
        "a draining runner serves no waiter behind the one it makes room for",
        {"a": ready(6, parallel=4, in_use=1)},
        ["b:6", "a"],
        [],
        Limits(8, 10),
        ("", "", "", "a"),
    ),
    (
        "runners not needed for room keep serving",
        {"a": busy(6, 1.0), "b": ready(2, 2.0, in_use=1, parallel=2)},
        ["c:6", "b"],
        [],
        Limits(8, 10),
        ("b", "", "", "a"),
    ),
    (
        "what a draining runner frees is claimed without more draining",
        {"a": Runner(State.DRAINING, 1, 1, 0.0, 6), "b": busy(2)},
        ["c:6"],
        [],
        Limits(8, 10),
        ("", "", "", ""),
    ),
    (
        "what a stopping runner frees is claimed without evicting",
        {"a": ready(2)},
        ["b:6"],
        [6],
        Limits(8, 10),
        ("", "", "", ""),
    ),
    (
        "a pinned idle runner is never evicted: the waiter waits",
        {"a": pinned(ready(6))},
        ["b:6"],
        [],
        Limits(8, 10),
        ("", "", "", ""),
    ),
    (
        "a pinned runner counts in the budget but the next oldest goes",
        {"a": pinned(ready(4, 1.0)), "b": ready(4, 2.0)},
        ["c:4"],
        [],
        Limits(8, 10),
        ("", "", "b", ""),
    ),
    (
        "a pinned busy runner never drains",
        {"a": pinned(busy(6))},
        ["b:6"],
        [],
        Limits(8, 10),
        ("", "", "", ""),
    ),
    (
        "a pinned runner serves like any other",
        {"a": pinned(ready(6))},
        ["a"],
        [],
        Limits(1, 10),
        ("a", "", "", ""),
    ),
    (
        "a loading runner is neither evicted nor drained",
        {"a": LOADING},
        ["b:8"],
        [],
        Limits(8, 10),
        ("", "", "", ""),
    ),
    (
        "FIFO: a small model does not pass a big one waiting for room",
        {"a": LOADING},
        ["b:8", "c:1"],
        [],
        Limits(8, 10),
        ("", "", "", ""),
    ),
    (
        "waiters behind a blocked one still take free slots",
        {"a": LOADING, "b": ready(1, parallel=2, in_use=1)},
        ["c:8", "b"],
        [],
        Limits(8, 10),
        ("b", "", "", ""),
    ),
    (
        "waiters of one model share one load",
        {},
        ["a:4", "a:4"],
        [],
        Limits(1, 10),
        ("", "a", "", ""),
    ),
    (
        "FIFO by claim order: two new models into one slot",
        {"a": ready(1)},
        ["b:1", "c:1"],
        [],
        Limits(1, 10),
        ("", "", "a", ""),
    ),
]


def waiter(spec: str) -> Waiter:
    key, _, memory = spec.partition(":")
    return Waiter(key, int(memory or 0))


def names(items: tuple[object, ...]) -> str:
    return " ".join(item.key if isinstance(item, Waiter) else str(item) for item in items)


class PlanTableTests(SynchronousTestCase):
    def test_cases(self) -> None:
        for why, runners, queue, stopping, limits, expected in CASES:
            decision = policy.plan([waiter(w) for w in queue], runners, stopping, limits)
            got = tuple(
                names(part) for part in (decision.assign, decision.load, decision.evict, decision.drain)
            )
            self.assertEqual(got, expected, why)


runner_states = st.builds(
    Runner,
    state=st.sampled_from([State.LOADING, State.READY, State.DRAINING]),  # the loader's `runners`
    in_use=st.integers(0, 2),
    parallel=st.just(2),
    finished_at=st.floats(0, 100),
    memory=st.integers(0, 10),
    pinned=st.booleans(),
)


class PlanPropertyTests(SynchronousTestCase):
    """What holds for every state: the budget and slots are kept, busy runners are never evicted."""

    @given(
        st.dictionaries(st.sampled_from("abcd"), runner_states, max_size=4),
        st.lists(st.builds(Waiter, st.sampled_from("abcdef"), st.integers(0, 10)), max_size=6),
        st.integers(1, 4),
    )
    def test_invariants(self, runners: dict[str, Runner], queue: list[Waiter], slots: int) -> None:
        limits = Limits(slots, 10)
        decision = policy.plan(queue, runners, [], limits)
        for key in decision.evict:
            self.assertEqual(runners[key].in_use, 0, "only idle runners are evicted")
            self.assertIs(runners[key].state, State.READY)
        for key in (*decision.evict, *decision.drain):
            self.assertFalse(runners[key].pinned, "a pinned runner is never stopped to make room")
        for key in decision.drain:
            self.assertIs(runners[key].state, State.READY)
            self.assertNotIn(key, decision.evict)
        kept = {key: r for key, r in runners.items() if key not in decision.evict}
        loads = {w.key: w.memory for w in decision.load}
        self.assertFalse(set(loads) & set(runners), "a running model is never loaded twice")
        if loads:
            self.assertLessEqual(len(kept) + len(loads), slots)
            self.assertLessEqual(sum(r.memory for r in kept.values()) + sum(loads.values()), 10)
        for w in decision.assign:
            runner = runners[w.key]
            self.assertIs(runner.state, State.READY)
        per_runner: dict[str, int] = {}
        for w in decision.assign:
            per_runner[w.key] = per_runner.get(w.key, 0) + 1
        for key, count in per_runner.items():
            self.assertLessEqual(count, runners[key].parallel - runners[key].in_use)
