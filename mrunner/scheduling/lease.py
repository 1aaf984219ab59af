"""A request's way to a runner: a L{Waiter} in the loader's queue, then a L{Lease} on one slot."""

from __future__ import annotations

from collections.abc import Callable

import attrs
from twisted.internet.defer import Deferred
from zope.interface import implementer

from mrunner.interfaces import ILease
from mrunner.runners.request import LoadRequest
from mrunner.runners.runner import Runner
from mrunner.scheduling import priority
from mrunner.values import Footprint, RunnerKey


@attrs.define(eq=False)
class Waiter:
    request: LoadRequest
    deferred: Deferred[Lease]
    #: Its class (L{priority}: 0 is served first) and when it came, for the queue's order.
    priority: int = priority.NORMAL
    since: float = 0.0

    @property
    def key(self) -> RunnerKey:
        return self.request.key

    @property
    def memory(self) -> int:
        return self.request.memory

    @property
    def footprint(self) -> Footprint:
        return self.request.footprint or Footprint(self.request.memory)


@implementer(ILease)
class Lease:
    """A request's hold on one of a runner's parallel slots: where to send it, and C{release}."""

    def __init__(self, runner: Runner, release: Callable[[Runner], None]):
        self.socket = runner.socket
        self.model = runner.request.model.name
        self._runner: Runner | None = runner
        self._release = release

    def release(self) -> None:
        """Give the slot back; only the first call counts."""
        runner, self._runner = self._runner, None
        if runner is not None:
            self._release(runner)


def instances(request: LoadRequest) -> list[RunnerKey]:
    """The keys of the runners that may serve C{request}: one per instance of its model."""
    return [attrs.evolve(request.key, instance=n) for n in range(request.instances)]


def first(key: RunnerKey) -> RunnerKey:
    """The key of the first instance of C{key}'s model, which its waiters and back-off go by."""
    return attrs.evolve(key, instance=0) if key.instance else key


def least_busy(runners: list[Runner]) -> Runner | None:
    """The runner with the most free slots (the first of equals), ready ones before the others."""
    return max(runners, key=lambda r: (r.has_room, r.parallel - r.in_use), default=None)
