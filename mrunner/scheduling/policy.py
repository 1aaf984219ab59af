"""The loader's decisions, as pure functions of its state: the time is an input, no processes."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

import attrs

from mrunner.scheduling.order import DEFAULT, Rules
from mrunner.scheduling.planner import Limits, Plan, Planner, RunnerView, WaiterView
from mrunner.values import State

__all__ = [
    "Limits",
    "Plan",
    "Rules",
    "State",
    "drained",
    "plan",
]

K = TypeVar("K", bound=Hashable)
W = TypeVar("W", bound=WaiterView)


def plan(
    queue: Sequence[W],
    runners: Mapping[K, RunnerView],
    stopping: Sequence[int],
    limits: Limits,
    stopping_gpus: Mapping[str, int] | None = None,
    instances: Callable[[W], Sequence[K]] | None = None,
    now: float = 0.0,
    rules: Rules = DEFAULT,
    costs: Mapping[K, float] | None = None,
) -> Plan[W, K]:
    """Decide who gets served, what loads, what is evicted and what drains.

    C{rules.order} takes the queue (L{mrunner.scheduling.order}): under FIFO,
    the default, in its order, as below; under "loaded", in three passes that
    let the loaded models serve their own first (C{costs}: seconds to load
    each runner again). C{now} is the time C{since} and C{loaded_at} are read against.

    A waiter whose runner has a free slot is
    served at once. Another claims a new runner's slot and memory: from what
    is free, else from what stopping or draining runners will free, else by
    evicting idle runners, least recently finished first, else by draining
    busy runners in the same order; a pinned runner is never chosen, though
    its memory counts. A draining runner finishes what it
    serves but takes no new request, so a model that is always busy cannot
    starve the one waiting for its memory; only the runners needed to make
    room drain, and none when even stopping them all would not make room
    (a loading runner holds it). The first waiter that cannot claim even so stops everyone
    behind it from claiming (they may still take free slots). C{stopping} is
    the memory of each runner still stopping (C{stopping_gpus}: what they hold on each GPU).
    With GPUs in the L{Limits}, and with C{instances} (the keys of the runners
    that may serve a waiter), a claim goes as L{Planner} says.
    """
    planner: Planner[W, K] = Planner.start(runners, stopping, limits, stopping_gpus or {}, now, rules)

    def keys(waiter: W) -> Sequence[K]:
        return instances(waiter) if instances else (waiter.key,)  # type: ignore[return-value]

    wake = rules.order.take(planner, queue, keys, costs or {})
    return attrs.evolve(planner.plan(), wake_at=wake)


def drained(runners: Mapping[K, RunnerView]) -> list[K]:
    """Draining runners whose last request has finished: stop them now."""
    return [key for key, r in runners.items() if r.state is State.DRAINING and r.in_use == 0]
