"""The order the wait queue is served in: by priority class, first come first served within one.

A pure decision, as L{mrunner.scheduling.policy} is: the loader orders its
queue with L{order} and hands the result to C{policy.plan}, which serves it in
that order. A class is an index into C{config.PRIORITIES} (0, C{high}, first).
A waiter that has waited C{starvation} seconds moves up one class, and one more
for each further C{starvation} seconds, so no waiter waits for ever behind a
stream of higher ones: after C{starvation} seconds times its class it is in the
top class, where arrival order alone decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from mrunner.values.request import NORMAL as NORMAL  # the class of a request whose key names none


class Ranked(Protocol):
    @property
    def priority(self) -> int: ...
    @property
    def since(self) -> float: ...


R = TypeVar("R", bound=Ranked)


def effective(waiter: Ranked, now: float, starvation: float) -> int:
    """C{waiter}'s class now: its own, one better for each C{starvation} seconds it has waited."""
    if starvation <= 0:
        return waiter.priority
    promoted = int((now - waiter.since) // starvation)
    return max(0, waiter.priority - max(0, promoted))


def order(queue: Iterable[R], now: float, starvation: float) -> list[R]:
    """C{queue} (in arrival order) in the order to serve it: best class first, arrival order within one.

    Python's sort is stable, so waiters of one class keep the order they came in.
    """
    return sorted(queue, key=lambda waiter: effective(waiter, now, starvation))


def first(queue: Iterable[R], now: float, starvation: float) -> R | None:
    """The waiter L{order} puts first, found in one pass (the loader asks at each release)."""
    best: R | None = None
    best_class = 0
    for waiter in queue:
        rank = effective(waiter, now, starvation)
        if best is None or rank < best_class:
            best, best_class = waiter, rank
            if rank == 0:
                break
    return best


def displaced(queue: Iterable[R], rank: int, now: float, starvation: float) -> R | None:
    """The waiter a full queue turns away so that a request of class C{rank} may wait, or None.

    The last to come of the worst class waiting, if that class (L{effective}, so a waiter
    promoted for its wait keeps its place) is worse than C{rank}: a full queue of low waiters
    never shuts out a high request, and a waiter only ever makes way for a better class.
    """
    worst: R | None = None
    worst_class = rank
    for waiter in queue:
        cls = effective(waiter, now, starvation)
        if cls >= worst_class and cls > rank:
            worst, worst_class = waiter, cls
    return worst
