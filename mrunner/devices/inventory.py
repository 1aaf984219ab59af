"""L{Devices}: the GPUs a llama-server build lists, NVML's live numbers for them, and the host's RAM.

A GPU's budget is ``[gpu] memory_budget`` of its total memory (a share, or bytes): a
number that runners' own use, or another process's, never moves. The RAM's budget is
the scheduler's ``memory_budget``. What runners hold on each device comes from
L{used_by_runners}. The GPUs' budgets change only when the devices are listed
again, so they are pushed then (L{Devices.watch}), and a load never looks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from zope.interface import implementer

from mrunner.config import GPUConfig, physical_memory
from mrunner.devices.listing import Listed
from mrunner.devices.nvml import Nvml
from mrunner.interfaces import IDevices
from mrunner.values import Device, RunnerSnapshot

CPU = "CPU"
#: Each GPU's budget in bytes, by device id, in the build's order.
Budgets = tuple[tuple[str, int], ...]
#: Seconds a ``--list-devices`` answers refreshes for: any caller of C{/engines/devices} (the page
#: polls it every 5 s, from each tab) would otherwise start a llama-server each time.
LISTING_MAX_AGE = 10.0


class DeviceSource(Protocol):
    """What lists the GPUs: the llama.cpp backend, through the build it installed."""

    @property
    def variant(self) -> str: ...

    def listed(self) -> list[Listed]:
        """The GPUs as last listed; none before the build is installed."""

    def list_devices(self) -> Deferred[list[Listed]]:
        """Run ``--list-devices`` again; L{listed} then answers with what it printed."""


def host_memory() -> tuple[int, int]:
    """The host's RAM: total, and available (C{MemAvailable}: free plus what the kernel can reclaim)."""
    total = physical_memory()
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return total, int(line.split()[1]) * 1024
    except OSError:
        pass
    return total, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def used_by_runners(runners: Iterable[RunnerSnapshot]) -> dict[str, int]:
    """Bytes the runners hold per device id: each runner's C{devices} when it reports them, else
    its whole memory on the C{CPU}.

    This is the hook for per-device runner memory: a snapshot with a C{devices} mapping
    (C{{"CUDA0": bytes, "CPU": bytes}}) is summed per id; one without counts as RAM.
    """
    used: dict[str, int] = {}
    for runner in runners:
        per_device: Mapping[str, int] = getattr(runner, "devices", None) or {CPU: runner.memory}
        for ident, size in per_device.items():
            used[ident] = used.get(ident, 0) + size
    return used


@implementer(IDevices)
@attrs.define
class Devices:
    """The devices runners can use, as the build lists them and C{[gpu]} allows, and the RAM.

    C{used} answers what runners hold per device id (L{used_by_runners}); C{nvml} is None
    where NVML does not load; C{host} reads the RAM (total, available); C{now} the time.
    """

    log = Logger()

    _source: DeviceSource
    _settings: GPUConfig
    _ram_budget: Callable[[], int]
    _used: Callable[[], Mapping[str, int]] = dict
    _nvml: Nvml | None = None
    _host: Callable[[], tuple[int, int]] = host_memory
    _now: Callable[[], float] = time.monotonic
    _listed_at: float | None = attrs.field(default=None, init=False)
    _unlisted: tuple[str, ...] = attrs.field(default=(), init=False)
    _live: dict[str, tuple[int, int]] = attrs.field(factory=dict, init=False)
    _waiters: list[Deferred[list[Device]]] = attrs.field(factory=list, init=False)
    _watchers: list[Callable[[Budgets], object]] = attrs.field(factory=list, init=False)
    _pushed: Budgets = attrs.field(default=(), init=False)

    @property
    def variant(self) -> str:
        return self._source.variant

    def devices(self) -> list[Device]:
        used = self._used()
        gpus = []
        for listed in self._allowed(self._source.listed()):
            total, free = self._live.get(listed.id, (listed.total, listed.free))
            gpus.append(
                Device(listed.id, listed.name, total, free, self._budget(total), used.get(listed.id, 0))
            )
        total, free = self._host()
        return [*gpus, Device(CPU, "host memory", total, free, self._ram_budget(), used.get(CPU, 0))]

    def watch(self, budgets: Callable[[Budgets], object]) -> None:
        self._push()
        self._watchers.append(budgets)
        budgets(self._pushed)

    def _push(self) -> None:
        """Tell the watchers the GPUs' budgets, when a new listing changed them."""
        budgets = self._budgets()
        if budgets != self._pushed:
            self._pushed = budgets
            for watcher in self._watchers:
                watcher(budgets)

    def _budgets(self) -> Budgets:
        return tuple(
            (listed.id, self._budget(self._live.get(listed.id, (listed.total, listed.free))[0]))
            for listed in self._allowed(self._source.listed())
        )

    def used_by(self, pid: int) -> dict[str, int]:
        """NVML's bytes for process C{pid} on each GPU; none where NVML does not load."""
        return {} if self._nvml is None else self._nvml.used_by(pid)

    def check(self) -> None:
        """Warn (once a change) of the C{[gpu] devices} the build does not list, naming those it does."""
        chosen = self._settings.devices
        listed = [device.id for device in self._source.listed()]
        unlisted = () if isinstance(chosen, str) else tuple(d for d in chosen if d not in listed)
        if unlisted and unlisted != self._unlisted:
            self.log.warn(
                "[gpu] devices names {unlisted}, which this llama-server ({variant}) does not list;"
                " it lists {listed}: runners use only those of [gpu] devices it lists",
                unlisted=", ".join(unlisted),
                variant=self.variant,
                listed=", ".join(listed) or "no GPU",
            )
        self._unlisted = unlisted
        self._push()  # the build is installed: its list is known

    def refresh(self) -> Deferred[list[Device]]:
        """NVML's numbers when it answers for every listed NVIDIA GPU, else the build's list again
        (the last one while it is under L{LISTING_MAX_AGE} seconds old)."""
        if self._nvml is not None:
            live = self._nvml.memory()
            wanted = {listed.id for listed in self._source.listed()}
            if live and wanted <= live.keys():
                self._live = live
                self._push()
                return succeed(self.devices())
        self._live = {}
        self._push()
        if self._listed_at is not None and self._now() - self._listed_at < LISTING_MAX_AGE:
            return succeed(self.devices())
        waiter: Deferred[list[Device]] = Deferred()
        self._waiters.append(waiter)
        if len(self._waiters) == 1:  # one llama-server --list-devices at a time, for every caller
            self._source.list_devices().addCallback(self._listed_again)
        return waiter

    def _listed_again(self, _: object) -> None:
        waiters, self._waiters = self._waiters, []
        self._listed_at = self._now()
        self._push()
        for waiter in waiters:
            waiter.callback(self.devices())

    def _allowed(self, listed: list[Listed]) -> list[Listed]:
        chosen = self._settings.devices
        if chosen == "none":
            return []
        if chosen == "auto":
            return listed
        return [device for device in listed if device.id in chosen]

    def _budget(self, total: int) -> int:
        share = self._settings.memory_budget
        return int(total * share) if isinstance(share, float) else min(share, total)
