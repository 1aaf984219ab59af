"""The loader's decisions, as pure functions of its state: no clock, no processes."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import attrs

from mrunner.values import State

__all__ = ["Limits", "Plan", "State", "drained", "next_backoff", "plan"]

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0


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
    @property
    def pinned(self) -> bool: ...


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
    """What to do now: hand runners to waiters, start loads, stop idle runners, drain busy ones."""

    assign: tuple[W, ...]
    load: tuple[W, ...]
    evict: tuple[K, ...]
    drain: tuple[K, ...] = ()


@attrs.define
class _Room:
    """Slots and memory free now, and what stopping or draining runners will free."""

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
    """Decide who gets served, what loads, what is evicted and what drains.

    The queue is taken in FIFO order. A waiter whose runner has a free slot is
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
    the memory of each runner still stopping.
    """
    free = {
        key: runner.parallel - runner.in_use for key, runner in runners.items() if runner.state is State.READY
    }
    budget = limits.memory_budget or math.inf
    draining = [runner for runner in runners.values() if runner.state is State.DRAINING]
    room = _Room(
        slots=limits.max_runners - len(runners) - len(stopping),
        memory=budget - sum(runner.memory for runner in runners.values()) - sum(stopping),
        coming_slots=len(stopping) + len(draining),
        coming_memory=sum(stopping) + sum(runner.memory for runner in draining),
    )
    by_age = sorted(
        (key for key in free if not runners[key].pinned), key=lambda key: runners[key].finished_at
    )
    claimed: set[Hashable] = set(runners)
    assign: list[W] = []
    load: list[W] = []
    evict: list[K] = []
    drain: list[K] = []
    blocked = False
    for waiter in queue:
        key: K = waiter.key  # type: ignore[assignment]
        if free.get(key, 0) > 0:
            free[key] -= 1
            assign.append(waiter)
            continue
        if blocked or key in claimed:
            continue
        if not room.fits(waiter.memory):
            victims = _victims(waiter.memory, room, by_age, runners, free)
            if victims is None:
                blocked = True
                continue
            for victim in victims:
                by_age.remove(victim)
                (evict if free[victim] == runners[victim].parallel else drain).append(victim)
                free[victim] = 0
                room.reclaim(runners[victim].memory)
        else:
            load.append(waiter)
        room.take(waiter.memory)
        claimed.add(key)
    return Plan(tuple(assign), tuple(load), tuple(evict), tuple(drain))


def _victims(
    memory: int, room: _Room, by_age: Sequence[K], runners: Mapping[K, RunnerView], free: Mapping[K, int]
) -> list[K] | None:
    """The runners to stop for C{memory}: idle ones first, then busy ones; None if even all won't do."""
    idle = [key for key in by_age if free[key] == runners[key].parallel]
    chosen: list[K] = []
    trial = attrs.evolve(room)
    for key in [*idle, *(key for key in by_age if key not in idle)]:
        if trial.will_fit(memory):
            break
        chosen.append(key)
        trial.reclaim(runners[key].memory)
    return chosen if trial.will_fit(memory) else None


def drained(runners: Mapping[K, RunnerView]) -> list[K]:
    """Draining runners whose last request has finished: stop them now."""
    return [key for key, r in runners.items() if r.state is State.DRAINING and r.in_use == 0]


def next_backoff(previous: float | None) -> float:
    """Seconds a key whose load failed fails fast: 1 s, doubling, at most 60 s."""
    return BACKOFF_FIRST if previous is None else min(previous * 2, BACKOFF_MAX)
