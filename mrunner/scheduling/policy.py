"""The loader's decisions, as pure functions of its state: no clock, no processes."""

from __future__ import annotations

import math
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
    @property
    def memory(self) -> int: ...


class WaiterView(Protocol):
    @property
    def key(self) -> Hashable: ...
    @property
    def memory(self) -> int: ...


K = TypeVar("K", bound=Hashable)
W = TypeVar("W", bound=WaiterView)


@attrs.frozen
class Limits:
    """Runner slots, and the memory budget in bytes (0: none)."""

    max_runners: int
    memory_budget: int = 0


@attrs.frozen
class Plan(Generic[W, K]):
    """What to do now: hand runners to waiters, start loads, stop idle runners."""

    assign: tuple[W, ...]
    load: tuple[W, ...]
    evict: tuple[K, ...]


@attrs.define
class _Room:
    """Slots and memory free now, and what stopping runners will free."""

    slots: float
    memory: float
    coming_slots: float = 0
    coming_memory: float = 0

    def fits(self, memory: int) -> bool:
        return self.slots >= 1 and self.memory >= memory

    def will_fit(self, memory: int) -> bool:
        return self.slots + self.coming_slots >= 1 and self.memory + self.coming_memory >= memory

    def take(self, memory: int) -> None:
        """Reserve a slot and C{memory}, from what is free now before what is coming."""
        self.slots, self.coming_slots = _take(1, self.slots, self.coming_slots)
        self.memory, self.coming_memory = _take(memory, self.memory, self.coming_memory)

    def reclaim(self, memory: int) -> None:
        self.coming_slots += 1
        self.coming_memory += memory


def _take(amount: float, free: float, coming: float) -> tuple[float, float]:
    now = min(max(free, 0), amount)
    return free - now, coming - (amount - now)


def plan(
    queue: Sequence[W], runners: Mapping[K, RunnerView], stopping: Sequence[int], limits: Limits
) -> Plan[W, K]:
    """Decide who gets served, what loads and what is evicted.

    Waiters whose runner has a free slot are served at once, wherever they
    stand in the queue. The rest claim a new runner's slot and memory in FIFO
    order: from what is free, else from what stopping runners will free, else
    by evicting idle runners, least recently finished first. A waiter that
    cannot fit even so blocks the waiters behind it from claiming, so no one
    starves. C{stopping} is the memory of each runner still stopping.
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
    budget = limits.memory_budget or math.inf
    room = _Room(
        slots=limits.max_runners - len(runners) - len(stopping),
        memory=budget - sum(runner.memory for runner in runners.values()) - sum(stopping),
        coming_slots=len(stopping),
        coming_memory=sum(stopping),
    )
    claimed: set[Hashable] = set(runners)
    load: list[W] = []
    evict: list[K] = []
    for waiter in unserved:
        if waiter.key in claimed:
            continue
        if room.fits(waiter.memory):
            load.append(waiter)
        else:
            while not room.will_fit(waiter.memory) and idle:
                victim = idle.pop(0)
                evict.append(victim)
                room.reclaim(runners[victim].memory)
            if not room.will_fit(waiter.memory):
                break
        room.take(waiter.memory)
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
