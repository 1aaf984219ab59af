"""The order the queue is served in between models: an L{Order}, chosen once from C{[scheduler]}'s
C{order} (L{BY_NAME}) and carried in the L{Rules} to the plan, the pacing and the loader.

L{FIFO} takes the queue as it stands; L{LOADED} lets the loaded models serve their own queues
before another's waiter, once overdue, may swap one out (L{patience}). Both are pure, as
L{policy.plan} is: they read and fill one plan's L{Planner}.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import attrs

from mrunner.scheduling import patience

if TYPE_CHECKING:
    from mrunner.scheduling.planner import Planner, WaiterView

K = TypeVar("K", bound=Hashable)
W = TypeVar("W", bound="WaiterView")


class Order(Protocol):
    """What differs between the orders: the passes over the queue, the runners a claim may stop,
    the eviction costs they weigh, and whether a freed slot may skip the plan."""

    def take(
        self,
        planner: Planner[W, K],
        queue: Sequence[W],
        keys: Callable[[W], Sequence[K]],
        costs: Mapping[K, float],
    ) -> float | None:
        """Serve or claim for each of C{queue}; when to plan again though nothing else changes."""

    def stoppable(self, planner: Planner[W, K]) -> list[K]:
        """The runners that may be stopped for the waiter being taken, in the order to stop them."""

    def costs(
        self, runners: Mapping[K, patience.Serving], measured: Callable[[K], float | None]
    ) -> dict[K, float]:
        """Seconds each of C{runners} would take to load again, as far as this order weighs them."""

    def hands_on(self, waiting: Iterable[Hashable], key: Hashable) -> bool:
        """Whether a slot a runner of C{key} frees goes straight to the queue's head, when it waits
        for C{key}, without a plan (C{waiting}: the key each waiter waits for)."""


@attrs.frozen
class Fifo:
    """The queue by class and arrival alone: the first waiter that needs room drains for it."""

    def take(
        self,
        planner: Planner[W, K],
        queue: Sequence[W],
        keys: Callable[[W], Sequence[K]],
        costs: Mapping[K, float],
    ) -> float | None:
        for waiter in queue:
            planner.take(waiter, keys(waiter))
        return None

    def stoppable(self, planner: Planner[W, K]) -> list[K]:
        """Any that may go, least recently finished first."""
        return planner.by_age

    def costs(
        self, runners: Mapping[K, patience.Serving], measured: Callable[[K], float | None]
    ) -> dict[K, float]:
        return {}

    def hands_on(self, waiting: Iterable[Hashable], key: Hashable) -> bool:
        """Always: the plan would serve the queue in order, free slots first."""
        return True


@attrs.frozen
class Loaded:
    """Serve before swapping: the loaded models' queues first, until another model's waiter is overdue.

    Three passes: overdue waiters (L{patience.overdue}) claim runners, but
    that a runner just loaded that serves (L{patience.protected_until}) or one
    an overdue waiter ahead waits for is kept; every waiter, in order, takes a
    free slot; the others claim runners, but that they may stop only idle ones
    nobody asks for, past their L{patience.grace}. Runners that may go go
    cheapest to bring back first (L{patience.eviction_order}).
    """

    def take(
        self,
        planner: Planner[W, K],
        queue: Sequence[W],
        keys: Callable[[W], Sequence[K]],
        costs: Mapping[K, float],
    ) -> float | None:
        """The overdue waiters' loads, free slots (in the queue's order, overdue or not: patience
        weighs models, not the classes of one), the other loads."""
        now, rules = planner.now, planner.rules
        planner.wanted = {key for waiter in queue for key in keys(waiter)}
        planner.by_age = patience.eviction_order(planner.by_age, planner.runners, costs, now)
        late = [patience.overdue(waiter, now, rules) for waiter in queue]
        for waiter in itertools.compress(queue, late):
            planner.claim(waiter, keys(waiter))
        served = [planner.serve(waiter, keys(waiter)) for waiter in queue]
        planner.patient = True
        for waiter, overdue, done in zip(queue, late, served, strict=True):
            if not overdue and not done:
                planner.claim(waiter, keys(waiter))
        rest = [waiter for waiter, overdue in zip(queue, late, strict=True) if not overdue]
        return patience.wake_at(rest, planner.runners.values(), now, rules) if queue else None

    def stoppable(self, planner: Planner[W, K]) -> list[K]:
        """For a waiter not overdue, only idle runners nobody asks for, past their grace; for an
        overdue one, any but those an earlier waiter waits for and those just loaded that serve."""
        if planner.patient:
            idle = [k for k in planner.by_age if planner.free[k] == planner.runners[k].parallel]
            return [
                k
                for k in idle
                if k not in planner.wanted and not patience.recent(planner.runners[k], planner.now)
            ]
        return [k for k in planner.by_age if k not in planner.awaited and not _protected(planner, k)]

    def costs(
        self, runners: Mapping[K, patience.Serving], measured: Callable[[K], float | None]
    ) -> dict[K, float]:
        """The measured load time, else the runner's own."""
        return {key: measured(key) or runner.load_seconds for key, runner in runners.items()}

    def hands_on(self, waiting: Iterable[Hashable], key: Hashable) -> bool:
        """Only when every waiter waits for C{key}: another model's may be overdue, and take the
        runner's place."""
        return all(other == key for other in waiting)


def _protected(planner: Planner[W, K], key: K) -> bool:
    """A runner just loaded that serves (a request in flight or asked for) is kept for now."""
    runner = planner.runners[key]
    serving = key in planner.wanted or planner.free[key] < runner.parallel
    return serving and planner.now < patience.protected_until(runner, planner.rules)


FIFO: Order = Fifo()
LOADED: Order = Loaded()
#: C{[scheduler]}'s C{order}, by the name the configuration gives it.
BY_NAME: Mapping[str, Order] = {"fifo": FIFO, "loaded": LOADED}


@attrs.frozen
class Rules:
    """C{[scheduler]}'s C{order}, C{max_wait} (seconds), C{min_serve} (a share of a runner's
    load time) and C{starvation_seconds}. The default order is FIFO."""

    order: Order = FIFO
    max_wait: float = 15.0
    min_serve: float = 1.0
    starvation: float = 60.0


#: The default rules: FIFO.
DEFAULT = Rules()
