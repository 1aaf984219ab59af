"""The loader's decisions, as pure functions of its state: no clock, no processes."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import attrs

from mrunner.scheduling.placing import place
from mrunner.scheduling.room import Room
from mrunner.values import HOST, ContextSize, Footprint, Placement, State, place_on

__all__ = [
    "Limits",
    "Plan",
    "Smaller",
    "State",
    "drained",
    "next_backoff",
    "plan",
    "smaller",
]

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
#: The smallest context a load out of device memory is retried with (a model trained for less: that).
MIN_CONTEXT = 2048


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
    def memory(self) -> int:
        """Bytes it holds in RAM (all of it, on a machine without GPUs)."""

    @property
    def pinned(self) -> bool: ...
    @property
    def on_gpus(self) -> Mapping[str, int]:
        """Bytes it holds on each GPU; read only when the L{Limits} name GPUs."""


class WaiterView(Protocol):
    @property
    def key(self) -> Hashable: ...
    @property
    def memory(self) -> int: ...
    @property
    def footprint(self) -> Footprint:
        """What its runner needs, layer by layer; read only when the L{Limits} name GPUs."""


K = TypeVar("K", bound=Hashable)
W = TypeVar("W", bound=WaiterView)


@attrs.frozen
class Limits:
    """Runner slots, the memory budget in bytes (0: none), and each GPU's budget in bytes
    (none on a machine without GPUs: the plan is then RAM's alone)."""

    max_runners: int
    memory_budget: int = 0
    gpus: tuple[tuple[str, int], ...] = ()


@attrs.frozen
class Plan(Generic[W, K]):
    """What to do now: hand runners to waiters, start loads, stop idle runners, drain busy ones.

    C{placements} has, for each waiter in C{load} when the L{Limits} name GPUs,
    where its runner's layers go. C{assign_to} and C{load_as} name, for each
    waiter in C{assign} and C{load}, the runner's key (one of its instances').
    """

    assign: tuple[W, ...]
    load: tuple[W, ...]
    evict: tuple[K, ...]
    drain: tuple[K, ...] = ()
    placements: tuple[Placement, ...] = ()
    assign_to: tuple[K, ...] = ()
    load_as: tuple[K, ...] = ()


def plan(
    queue: Sequence[W],
    runners: Mapping[K, RunnerView],
    stopping: Sequence[int],
    limits: Limits,
    stopping_gpus: Mapping[str, int] | None = None,
    instances: Callable[[W], Sequence[K]] | None = None,
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
    the memory of each runner still stopping (C{stopping_gpus}: what they hold on each GPU).

    With GPUs in the L{Limits}, memory is each GPU's and RAM's together, and a
    new runner's placement is the best L{place} finds in what it could have
    once every runner that may be stopped has gone: taken now if what is free
    gives as many GPU layers, else made by stopping runners as above, only
    ones that hold memory where the placement is short.

    C{instances} gives the keys of the runners that may serve a waiter (its
    model's instances, the first one first): a waiter goes to the one with
    the most free slots. When all are busy and one of them is running, the
    next one loads only if it fits now without stopping anything, and, with
    GPUs, whole on GPUs its siblings do not use; else the waiter waits for a
    slot, and holds no one else up.
    """
    planner: _Planner[W, K] = _Planner.start(runners, stopping, limits, stopping_gpus or {})
    for waiter in queue:
        keys: Sequence[K] = instances(waiter) if instances else (waiter.key,)  # type: ignore[assignment]
        planner.take(waiter, keys)
    return planner.plan()


@attrs.define
class _Planner(Generic[W, K]):
    """One plan's working state: what is free, claimed and chosen so far, waiter by waiter."""

    runners: Mapping[K, RunnerView]
    gpus: list[str]
    budgets: dict[str, float]
    room: Room
    #: Free slots of each ready runner.
    free: dict[K, int]
    #: The runners that may be stopped, least recently finished first.
    by_age: list[K]
    claimed: set[Hashable]
    on_devices: dict[Hashable, set[str]]
    assign: list[W] = attrs.Factory(list)
    assign_to: list[K] = attrs.Factory(list)
    load: list[W] = attrs.Factory(list)
    load_as: list[K] = attrs.Factory(list)
    placements: list[Placement] = attrs.Factory(list)
    evict: list[K] = attrs.Factory(list)
    drain: list[K] = attrs.Factory(list)
    blocked: bool = False

    @classmethod
    def start(
        cls,
        runners: Mapping[K, RunnerView],
        stopping: Sequence[int],
        limits: Limits,
        stopping_gpus: Mapping[str, int],
    ) -> _Planner[W, K]:
        free = {key: r.parallel - r.in_use for key, r in runners.items() if r.state is State.READY}
        gpus = [device for device, _ in limits.gpus]
        budgets: dict[str, float] = {HOST: limits.memory_budget or math.inf, **dict(limits.gpus)}
        gone = {HOST: sum(stopping), **stopping_gpus}
        holding = [_held(runner, gpus) for runner in runners.values()]
        draining = [_held(runner, gpus) for runner in runners.values() if runner.state is State.DRAINING]
        room = Room(
            slots=limits.max_runners - len(runners) - len(stopping),
            memory={d: budget - sum(h[d] for h in holding) - gone.get(d, 0) for d, budget in budgets.items()},
            coming_slots=len(stopping) + len(draining),
            coming_memory={d: gone.get(d, 0) + sum(h[d] for h in draining) for d in budgets},
        )
        by_age = sorted((k for k in free if not runners[k].pinned), key=lambda k: runners[k].finished_at)
        on_devices = {key: set(runner.on_gpus) if gpus else set() for key, runner in runners.items()}
        return cls(runners, gpus, budgets, room, free, by_age, set(runners), on_devices)  # type: ignore[arg-type]

    def held(self, key: K) -> dict[str, int]:
        return _held(self.runners[key], self.gpus)

    def take(self, waiter: W, keys: Sequence[K]) -> None:
        """Serve C{waiter} from a free slot, or claim a runner for it, or leave it waiting."""
        serving = [k for k in keys if self.free.get(k, 0) > 0]
        if serving:
            key = max(serving, key=lambda k: self.free[k])
            self.free[key] -= 1
            self.assign.append(waiter)
            self.assign_to.append(key)
            return
        unclaimed = [k for k in keys if k not in self.claimed]
        if self.blocked or not unclaimed:
            return
        siblings = [k for k in keys if k in self.claimed]
        if siblings:
            self._another(waiter, unclaimed[0], siblings)
        else:
            self._claim(waiter, unclaimed[0])

    def _another(self, waiter: W, key: K, siblings: Sequence[K]) -> None:
        """Load another instance beside C{siblings} only if it fits now; else C{waiter} waits for a slot."""
        taken = set().union(*(self.on_devices.get(k, set()) for k in siblings))
        placement = _extra(waiter, self.room, self.gpus, taken)
        if placement is not None:
            self._load(waiter, key, placement if self.gpus else None)
            self.room.take(_need(placement))
            self.claimed.add(key)
            self.on_devices[key] = set(placement.on_gpus)

    def _claim(self, waiter: W, key: K) -> None:
        """Claim a slot and memory for C{waiter}'s new runner: free now, else by stopping runners."""
        need: dict[str, int] = {HOST: waiter.memory}
        placement = self._placement(waiter) if self.gpus else None
        if placement is not None:
            need = _need(placement)
            self.on_devices[key] = set(placement.on_gpus)
        if not self.room.fits(need):
            victims = _victims(need, self.room, self.by_age, self.runners, self.free, self.held, self.gpus)
            if victims is None:
                self.blocked = True
                return
            for victim in victims:
                self.by_age.remove(victim)
                idle = self.free[victim] == self.runners[victim].parallel
                (self.evict if idle else self.drain).append(victim)
                self.free[victim] = 0
                self.room.reclaim(self.held(victim))
        else:
            self._load(waiter, key, placement)
        self.room.take(need)
        self.claimed.add(key)

    def _placement(self, waiter: W) -> Placement:
        """The most GPU layers C{waiter} could get once every runner that may go has gone; now, if as good."""
        reach = self.room.copy()
        for victim in self.by_age:
            reach.reclaim(self.held(victim))
        possible = {d: reach.memory[d] + reach.coming_memory.get(d, 0) for d in self.budgets}
        placement = place(waiter.footprint, possible, self.gpus)
        now = place(waiter.footprint, self.room.memory, self.gpus)
        return now if now.gpu_layers >= placement.gpu_layers and self.room.fits(_need(now)) else placement

    def _load(self, waiter: W, key: K, placement: Placement | None) -> None:
        self.load.append(waiter)
        self.load_as.append(key)
        if placement is not None:
            self.placements.append(placement)

    def plan(self) -> Plan[W, K]:
        return Plan(
            tuple(self.assign),
            tuple(self.load),
            tuple(self.evict),
            tuple(self.drain),
            tuple(self.placements),
            tuple(self.assign_to),
            tuple(self.load_as),
        )


def _held(runner: RunnerView, gpus: Sequence[str]) -> dict[str, int]:
    """What C{runner} holds on each device the plan weighs."""
    return {HOST: runner.memory, **({d: runner.on_gpus.get(d, 0) for d in gpus} if gpus else {})}


def _extra(waiter: WaiterView, room: Room, gpus: Sequence[str], taken: set[str]) -> Placement | None:
    """Where another instance of C{waiter}'s model fits now, beside the ones running; None if not.

    With GPUs, whole on ones its siblings do not use, so each instance has
    its own; without, in RAM.
    """
    if not gpus:
        placement = place_on(Footprint(waiter.memory), {})
    else:
        footprint = waiter.footprint
        placement = place(footprint, room.memory, [d for d in gpus if d not in taken])
        if not footprint.layers or placement.gpu_layers < footprint.offloadable:
            return None
    return placement if room.fits(_need(placement)) else None


def _need(placement: Placement) -> dict[str, int]:
    return dict(placement.memory)


def _victims(
    need: Mapping[str, int],
    room: Room,
    by_age: Sequence[K],
    runners: Mapping[K, RunnerView],
    free: Mapping[K, int],
    held: Callable[[K], Mapping[str, int]],
    gpus: Sequence[str],
) -> list[K] | None:
    """The runners to stop for C{need}: idle ones first, then busy ones; None if even all won't do.

    With C{gpus}, a runner that holds nothing where C{need} is still short
    (a slot, RAM, a GPU) is passed over: evicting it would free nothing needed.
    """
    idle = [key for key in by_age if free[key] == runners[key].parallel]
    chosen: list[K] = []
    trial = room.copy()
    for key in [*idle, *(key for key in by_age if key not in idle)]:
        short = trial.short(need)
        if not short:
            break
        holds = held(key)
        if gpus and "slots" not in short and not any(holds.get(d, 0) > 0 for d in short):
            continue
        chosen.append(key)
        trial.reclaim(holds)
    return None if trial.short(need) else chosen


@attrs.frozen
class Smaller:
    """The next smaller plan for a load that ran out of device memory: at most C{offload} layers
    on the GPUs, and a context of C{context} tokens (None: as before)."""

    offload: int | None = None
    context: int | None = None


def smaller(footprint: Footprint, gpu_layers: int, context: ContextSize | None) -> Smaller | None:
    """The one retry of a load that ran out of device memory; None: nothing is smaller, give up.

    A quarter fewer layers on the GPUs (when C{footprint} has no cap, neither the user's nor
    a retry's, and some were offloaded), and half the C{context} (given only when the user
    fixed none and no retry halved it), not below L{MIN_CONTEXT} or the context in force if
    that is less: a model answers with a smaller context, but not with one smaller than a chat
    needs. Both at once, so that one retry is the only one: a retried plan has its cap, and
    its context halved or fixed.
    """
    fewer = gpu_layers * 3 // 4 if footprint.offload is None and gpu_layers else None
    half = None
    if context is not None and context.asked is not None:
        half = max(context.asked // 2, min(MIN_CONTEXT, context.in_force or MIN_CONTEXT))
        half = half if half < context.asked else None
    return None if fewer is None and half is None else Smaller(offload=fewer, context=half)


def drained(runners: Mapping[K, RunnerView]) -> list[K]:
    """Draining runners whose last request has finished: stop them now."""
    return [key for key, r in runners.items() if r.state is State.DRAINING and r.in_use == 0]


def next_backoff(previous: float | None) -> float:
    """Seconds a key whose load failed fails fast: 1 s, doubling, at most 60 s."""
    return BACKOFF_FIRST if previous is None else min(previous * 2, BACKOFF_MAX)
