"""One plan's working state, and the views and records it is made of.

L{policy.plan} starts a L{Planner} from the runners, the limits and the
rules, hands it to the rules' L{order.Order} to take the queue waiter by
waiter, and reads the L{Plan} it yields.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import attrs

from mrunner.scheduling.order import DEFAULT, Rules
from mrunner.scheduling.placing import place
from mrunner.scheduling.room import Room, choose_victims
from mrunner.values import HOST, Footprint, Placement, State, place_on


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

    # Read only under C{order = "loaded"} (L{mrunner.scheduling.patience.Serving}).
    @property
    def loaded_at(self) -> float: ...
    @property
    def load_seconds(self) -> float: ...
    @property
    def served(self) -> int: ...


class WaiterView(Protocol):
    @property
    def key(self) -> Hashable: ...
    @property
    def memory(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def since(self) -> float:
        """When it came; read only under C{order = "loaded"}, as C{priority} is."""

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
    #: When to plan again though nothing else changes (L{mrunner.scheduling.patience.wake_at}); None: no need.
    wake_at: float | None = None


@attrs.define
class Planner(Generic[W, K]):
    """One plan's working state: what is free, claimed and chosen so far, waiter by waiter.

    With GPUs in the L{Limits}, memory is each GPU's and RAM's together, and a
    new runner's placement is the best L{place} finds in what it could have
    once every runner that may be stopped has gone: taken now if what is free
    gives as many GPU layers, else made by stopping runners, only ones that
    hold memory where the placement is short.

    A waiter's keys are the runners that may serve it (its model's instances,
    the first one first): it goes to the one with the most free slots. When
    all are busy and one of them is running, the next one loads only if it
    fits now without stopping anything, and, with GPUs, whole on GPUs its
    siblings do not use; else the waiter waits for a slot, and holds no one
    else up.
    """

    runners: Mapping[K, RunnerView]
    gpus: list[str]
    budgets: dict[str, float]
    room: Room
    #: Free slots of each ready runner.
    free: dict[K, int]
    #: The runners that may be stopped, in the order to stop them: least recently finished first
    #: (under C{order = "loaded"}, cheapest to bring back first).
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
    #: The time the waiters' C{since} and runners' C{loaded_at} are read against, and the rules.
    now: float = 0.0
    rules: Rules = DEFAULT
    #: Under C{order = "loaded"}: the runners some waiter asks for.
    wanted: set[K] = attrs.Factory(set)
    #: Runners an earlier waiter waits for a slot of: under "loaded", not stopped for a later one.
    awaited: set[K] = attrs.Factory(set)
    #: Taking waiters that are not overdue: only idle runners nobody asks for may go.
    patient: bool = False

    @classmethod
    def start(
        cls,
        runners: Mapping[K, RunnerView],
        stopping: Sequence[int],
        limits: Limits,
        stopping_gpus: Mapping[str, int],
        now: float,
        rules: Rules,
    ) -> Planner[W, K]:
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
        planner = cls(runners, gpus, budgets, room, free, by_age, set(runners), on_devices)  # type: ignore[arg-type]
        planner.now, planner.rules = now, rules
        return planner

    def held(self, key: K) -> dict[str, int]:
        return _held(self.runners[key], self.gpus)

    def serve(self, waiter: W, keys: Sequence[K]) -> bool:
        """Hand C{waiter} the free slot of the runner with most; False when none has one."""
        serving = [k for k in keys if self.free.get(k, 0) > 0]
        if not serving:
            return False
        key = max(serving, key=lambda k: self.free[k])
        self.free[key] -= 1
        self.assign.append(waiter)
        self.assign_to.append(key)
        return True

    def stoppable(self) -> list[K]:
        """The runners that may be stopped for the waiter being taken, in the order to stop them."""
        return self.rules.order.stoppable(self)

    def take(self, waiter: W, keys: Sequence[K]) -> None:
        """Serve C{waiter} from a free slot, or claim a runner for it, or leave it waiting."""
        if not self.serve(waiter, keys):
            self.claim(waiter, keys)

    def claim(self, waiter: W, keys: Sequence[K]) -> None:
        """Claim a runner for C{waiter} unless one of its model's has a free slot (it is served
        from that), or leave it waiting."""
        self.awaited.update(k for k in keys if k in self.runners)
        if any(self.free.get(k, 0) > 0 for k in keys):
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
            victims = choose_victims(
                need, self.room, self.stoppable(), self.runners, self.free, self.held, self.gpus
            )
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
        """The most GPU layers C{waiter} could get once every runner that may go has gone; now, if as good.

        Under C{order = "loaded"} too: a waiter whose best placement needs a busy runner's room
        waits until it is overdue, rather than loading now with fewer layers for its runner's life.
        """
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
