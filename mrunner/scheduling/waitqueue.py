"""The loader's bounded queue of waiters: how many wait for what, who comes before whom, and who
is turned away when it is full or its runner cannot come."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mrunner.scheduling import priority, refusals
from mrunner.scheduling.lease import Waiter
from mrunner.values import RunnerKey, Waiting


class WaitQueue(deque[Waiter]):
    """The waiters in arrival order (L{priority} orders them for a plan), at most C{limit} of them."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    @property
    def full(self) -> bool:
        return len(self) >= self.limit

    def waiting(self, now: float) -> list[Waiting]:
        """How many wait for each model's runner, and how long the oldest has, at C{now}."""
        found: dict[RunnerKey, tuple[Waiter, int, float]] = {}
        for waiter in self:
            first, count, since = found.get(waiter.key, (waiter, 0, waiter.since))
            found[waiter.key] = (first, count + 1, min(since, waiter.since))
        return [
            Waiting(key.backend, first.request.model.name, key.model, key.mode, count, now - since)
            for key, (first, count, since) in found.items()
        ]

    def ahead(self, deferred: Deferred[Any]) -> int | None:
        """How many come before the waiter whose lease is C{deferred}: a better class, or the same
        one and earlier (what a streamed request's wait notes say); None when it is not queued."""
        mine = next((waiter for waiter in self if waiter.deferred is deferred), None)
        if mine is None:
            return None
        return sum((waiter.priority, waiter.since) < (mine.priority, mine.since) for waiter in self)

    def make_way(self, rank: int, now: float, starvation: float) -> bool:
        """Turn away the waiter a request of class C{rank} may take the place of in the full queue
        (L{priority.displaced}); False when there is none."""
        waiter = priority.displaced(self, rank, now, starvation)
        if waiter is None:
            return False
        self.remove(waiter)
        waiter.deferred.errback(
            refusals.queue_full(self.limit, "a request of a higher priority class took this place; try again")
        )
        return True

    def fail(self, key: Hashable, reason: Failure) -> None:
        """Fail the waiters for C{key}'s runner with C{reason}."""
        for waiter in [w for w in self if w.key == key]:
            self.remove(waiter)
            waiter.deferred.errback(reason)

    def close(self) -> None:
        """Fail every waiter: the loader is shutting down."""
        while self:
            self.popleft().deferred.errback(refusals.shutting_down())
