"""The loader's decisions, as pure functions of its state: no clock, no processes."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Generic, Protocol, TypeVar

import attrs

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0


class State(Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"


class RunnerView(Protocol):
    @property
    def state(self) -> State: ...
    @property
    def in_use(self) -> int: ...
    @property
    def parallel(self) -> int: ...
    @property
    def finished_at(self) -> float: ...


class WaiterView(Protocol):
    @property
    def key(self) -> Hashable: ...


K = TypeVar("K", bound=Hashable)
W = TypeVar("W", bound=WaiterView)


@attrs.frozen
class Plan(Generic[W, K]):
    """What to do now: hand runners to waiters, start loads, stop idle runners."""

    assign: tuple[W, ...]
    load: tuple[W, ...]
    evict: tuple[K, ...]


def plan(queue: Sequence[W], runners: Mapping[K, RunnerView], stopping: int, max_runners: int) -> Plan[W, K]:
    """Decide who gets served, what loads and what is evicted.

    Waiters whose runner has a free slot are served at once, wherever they
    stand in the queue. The rest claim new runner slots in FIFO order: a free
    slot, else a slot that a stopping runner will free, else the idle runner
    that finished least recently is evicted. A waiter that can get none blocks
    the waiters behind it from claiming slots, so no one starves.
    """
    free = {
        key: runner.parallel - runner.in_use for key, runner in runners.items() if runner.state is State.READY
    }
    assign = []
    unserved = []
    for waiter in queue:
        key: K = waiter.key  # type: ignore[assignment]
        if free.get(key, 0) > 0:
            free[key] -= 1
            assign.append(waiter)
        else:
            unserved.append(waiter)

    idle = sorted(
        (
            key
            for key, runner in runners.items()
            if runner.state is State.READY and runner.in_use == 0 and free[key] == runner.parallel
        ),
        key=lambda key: runners[key].finished_at,
    )
    used = len(runners) + stopping
    reclaiming = stopping
    claimed: set[Hashable] = set(runners)
    load: list[W] = []
    evict: list[K] = []
    for waiter in unserved:
        if waiter.key in claimed:
            continue
        if used < max_runners:
            used += 1
            load.append(waiter)
        elif reclaiming:
            reclaiming -= 1
        elif idle:
            evict.append(idle.pop(0))
        else:
            break
        claimed.add(waiter.key)
    return Plan(tuple(assign), tuple(load), tuple(evict))


def drained(runners: Mapping[K, RunnerView]) -> list[K]:
    """Draining runners whose last request has finished: stop them now."""
    return [key for key, r in runners.items() if r.state is State.DRAINING and r.in_use == 0]


def idle(runners: Mapping[K, RunnerView]) -> Iterable[K]:
    """Ready runners serving nobody: their keep-alive clock runs."""
    return (key for key, r in runners.items() if r.state is State.READY and r.in_use == 0)


def next_backoff(previous: float | None) -> float:
    """Seconds a key whose load failed fails fast: 1 s, doubling, at most 60 s."""
    return BACKOFF_FIRST if previous is None else min(previous * 2, BACKOFF_MAX)
