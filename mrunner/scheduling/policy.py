"""The loader's decisions, as pure functions of its state: no clock, no processes."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import attrs

from mrunner.values import HOST, ContextSize, Footprint, Placement, State, place_on

__all__ = [
    "Limits",
    "Plan",
    "Smaller",
    "State",
    "drained",
    "next_backoff",
    "place",
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


Memory = dict[str, float]


@attrs.define
class _Room:
    """Slots and memory free now on each device, and what stopping or draining runners will free."""

    slots: float
    memory: Memory
    coming_slots: float = 0
    coming_memory: Memory = attrs.Factory(dict)

    def fits(self, need: Mapping[str, int]) -> bool:
        return self.slots >= 1 and all(self.memory[d] >= n for d, n in need.items())

    def short(self, need: Mapping[str, int]) -> set[str]:
        """The devices (and C{slots}) that even what is coming leaves short of C{need}."""
        slots = {"slots"} if self.slots + self.coming_slots < 1 else set()
        return slots | {d for d, n in need.items() if self.memory[d] + self.coming_memory.get(d, 0) < n}

    def take(self, need: Mapping[str, int]) -> None:
        """Reserve a slot and C{need}, from what is free now before what is coming."""
        self.slots, self.coming_slots = _take(1, self.slots, self.coming_slots)
        for d, n in need.items():
            self.memory[d], self.coming_memory[d] = _take(n, self.memory[d], self.coming_memory.get(d, 0))

    def reclaim(self, held: Mapping[str, int]) -> None:
        self.coming_slots += 1
        for d, n in held.items():
            self.coming_memory[d] = self.coming_memory.get(d, 0) + n

    def copy(self) -> _Room:
        return _Room(self.slots, dict(self.memory), self.coming_slots, dict(self.coming_memory))


def _take(amount: float, free: float, coming: float) -> tuple[float, float]:
    now = min(max(free, 0), amount)
    return free - now, coming - (amount - now)


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
    free = {
        key: runner.parallel - runner.in_use for key, runner in runners.items() if runner.state is State.READY
    }
    gpus = [device for device, _ in limits.gpus]

    def held(runner: RunnerView) -> dict[str, int]:
        return {HOST: runner.memory, **({d: runner.on_gpus.get(d, 0) for d in gpus} if gpus else {})}

    budgets: dict[str, float] = {HOST: limits.memory_budget or math.inf, **dict(limits.gpus)}
    gone = {HOST: sum(stopping), **(stopping_gpus or {})}
    holding = [held(runner) for runner in runners.values()]
    draining = [held(runner) for runner in runners.values() if runner.state is State.DRAINING]
    room = _Room(
        slots=limits.max_runners - len(runners) - len(stopping),
        memory={d: budget - sum(h[d] for h in holding) - gone.get(d, 0) for d, budget in budgets.items()},
        coming_slots=len(stopping) + len(draining),
        coming_memory={d: gone.get(d, 0) + sum(h[d] for h in draining) for d in budgets},
    )
    by_age = sorted(
        (key for key in free if not runners[key].pinned), key=lambda key: runners[key].finished_at
    )
    claimed: set[Hashable] = set(runners)
    on_devices = {key: set(runner.on_gpus) if gpus else set() for key, runner in runners.items()}
    assign: list[W] = []
    assign_to: list[K] = []
    load: list[W] = []
    load_as: list[K] = []
    placements: list[Placement] = []
    evict: list[K] = []
    drain: list[K] = []
    blocked = False
    for waiter in queue:
        keys: Sequence[K] = instances(waiter) if instances else (waiter.key,)  # type: ignore[assignment]
        serving = [k for k in keys if free.get(k, 0) > 0]
        if serving:
            key = max(serving, key=lambda k: free[k])
            free[key] -= 1
            assign.append(waiter)
            assign_to.append(key)
            continue
        unclaimed = [k for k in keys if k not in claimed]
        if blocked or not unclaimed:
            continue
        key = unclaimed[0]
        siblings = [k for k in keys if k in claimed]
        if siblings:
            taken = set().union(*(on_devices.get(k, set()) for k in siblings))
            placement = _extra(waiter, room, gpus, taken)
            if placement is not None:
                load.append(waiter)
                load_as.append(key)
                placements.extend([placement] if gpus else [])
                room.take(_need(placement))
                claimed.add(key)
                on_devices[key] = set(placement.on_gpus)
            continue
        need: dict[str, int] = {HOST: waiter.memory}
        placement = None
        if gpus:
            reach = room.copy()
            for victim in by_age:
                reach.reclaim(held(runners[victim]))
            possible = {d: reach.memory[d] + reach.coming_memory.get(d, 0) for d in budgets}
            placement = place(waiter.footprint, possible, gpus)
            now = place(waiter.footprint, room.memory, gpus)
            if now.gpu_layers >= placement.gpu_layers and room.fits(_need(now)):
                placement = now
            need = _need(placement)
            on_devices[key] = set(placement.on_gpus)
        if not room.fits(need):
            victims = _victims(need, room, by_age, runners, free, held, bool(gpus))
            if victims is None:
                blocked = True
                continue
            for victim in victims:
                by_age.remove(victim)
                (evict if free[victim] == runners[victim].parallel else drain).append(victim)
                free[victim] = 0
                room.reclaim(held(runners[victim]))
        else:
            load.append(waiter)
            load_as.append(key)
            if placement is not None:
                placements.append(placement)
        room.take(need)
        claimed.add(key)
    return Plan(
        tuple(assign),
        tuple(load),
        tuple(evict),
        tuple(drain),
        tuple(placements),
        tuple(assign_to),
        tuple(load_as),
    )


def _extra(waiter: WaiterView, room: _Room, gpus: Sequence[str], taken: set[str]) -> Placement | None:
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
    room: _Room,
    by_age: Sequence[K],
    runners: Mapping[K, RunnerView],
    free: Mapping[K, int],
    held: Callable[[RunnerView], Mapping[str, int]],
    only_concerned: bool,
) -> list[K] | None:
    """The runners to stop for C{need}: idle ones first, then busy ones; None if even all won't do.

    With C{only_concerned}, a runner that holds nothing where C{need} is still
    short (a slot, RAM, a GPU) is passed over: evicting it would free nothing needed.
    """
    idle = [key for key in by_age if free[key] == runners[key].parallel]
    chosen: list[K] = []
    trial = room.copy()
    for key in [*idle, *(key for key in by_age if key not in idle)]:
        short = trial.short(need)
        if not short:
            break
        holds = held(runners[key])
        if only_concerned and "slots" not in short and not any(holds.get(d, 0) > 0 for d in short):
            continue
        chosen.append(key)
        trial.reclaim(holds)
    return None if trial.short(need) else chosen


def place(footprint: Footprint, room: Mapping[str, float], gpus: Sequence[str]) -> Placement:
    """The best L{Placement} of C{footprint} in C{room} (bytes free on each of C{gpus}).

    Every layer on the one GPU where they fit with the least room to spare,
    so the largest gaps stay for others; else spread over the fewest GPUs,
    largest room first, in proportion to their room (``--tensor-split``);
    else as many layers as fit on them all, the rest in RAM. RAM is not
    checked here: more layers on GPUs always leave less in it. At most
    C{footprint.offloadable} layers are placed on GPUs.
    """
    want = footprint.offloadable
    if not want:
        return place_on(footprint, {})
    fit = {d: _layers_fitting(footprint, room.get(d, 0)) for d in gpus}
    whole = [d for d in gpus if fit[d] >= want]
    if whole:
        return place_on(footprint, {min(whole, key=lambda d: room[d]): want})
    chosen: dict[str, int] = {}
    for device in sorted((d for d in gpus if fit[d] > 0), key=lambda d: -fit[d]):
        if sum(chosen.values()) >= want:
            break
        chosen[device] = fit[device]
    share = _share(want, chosen)
    return place_on(footprint, {d: share[d] for d in gpus if d in share})


def _layers_fitting(footprint: Footprint, room: float) -> int:
    """How many of C{footprint}'s layers C{room} bytes hold, beside a GPU's compute buffer."""
    if room < footprint.per_device + footprint.per_layer:
        return 0
    if not footprint.per_layer or math.isinf(room):
        return footprint.layers
    return min(footprint.layers, int((room - footprint.per_device) // footprint.per_layer))


def _share(layers: int, fitting: Mapping[str, int]) -> dict[str, int]:
    """C{layers} over devices in proportion to how many each holds (largest remainders round up,
    so none gets more than it holds); all they hold when that is fewer."""
    total = sum(fitting.values())
    if total <= layers:
        return dict(fitting)
    share = {d: layers * n // total for d, n in fitting.items()}
    behind = sorted(fitting, key=lambda d: -(layers * fitting[d] % total))  # the largest remainders
    for device in behind[: layers - sum(share.values())]:
        share[device] += 1
    return share


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
