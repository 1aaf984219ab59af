"""What a plan has to work with: free slots and memory per device now, and what stopping runners will free."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol, TypeVar

import attrs

Memory = dict[str, float]


class Parallel(Protocol):
    @property
    def parallel(self) -> int: ...


K = TypeVar("K", bound=Hashable)


@attrs.define
class Room:
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

    def copy(self) -> Room:
        return Room(self.slots, dict(self.memory), self.coming_slots, dict(self.coming_memory))


def _take(amount: float, free: float, coming: float) -> tuple[float, float]:
    now = min(max(free, 0), amount)
    return free - now, coming - (amount - now)


def choose_victims(
    need: Mapping[str, int],
    room: Room,
    by_age: Sequence[K],
    runners: Mapping[K, Parallel],
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
