"""The loader's runners: every one whose process has not ended, and the one each key's requests go to."""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from mrunner.interfaces import ILoaderEvents, IRunnerProcess
from mrunner.runners.holding import GpuUse, unmeasured
from mrunner.runners.request import LoadRequest
from mrunner.runners.runner import Keeper, Runner
from mrunner.scheduling import placing
from mrunner.scheduling.policy import Limits
from mrunner.values import Footprint, Placement, RunnerKey, State


@implementer(ILoaderEvents)
class NoEvents:
    """Tells no one: a loader without metrics."""

    def loaded(self, key: RunnerKey, model: str, seconds: float) -> None:
        pass

    def load_failed(self, key: RunnerKey, model: str) -> None:
        pass

    def evicted(self, key: RunnerKey, model: str, reason: str) -> None:
        pass

    def exited(self, key: RunnerKey, model: str, cause: str) -> None:
        pass


class Roster:
    """Every runner whose process has not ended, and the one each key's new requests go to."""

    def __init__(
        self, clock: IReactorTime, events: ILoaderEvents, keeper: Keeper, gpu_use: GpuUse = unmeasured
    ):
        self.clock = clock
        self.events = events
        self.keeper = keeper
        #: What NVML measures of a runner process on each GPU (nothing without NVML).
        self.gpu_use = gpu_use
        #: The runner each key's requests go to: loading, ready or draining.
        self.by_key: dict[RunnerKey, Runner] = {}
        self._alive: dict[Runner, None] = {}  # in order of loading
        self._empty: list[Deferred[None]] = []

    def add(
        self, request: LoadRequest, process: IRunnerProcess, placement: Placement | None = None
    ) -> Runner:
        """Start a runner of C{process} for C{request} (its layers where C{placement} says) and keep it.

        @raise Exception: its process could not be spawned; nothing is kept.
        """
        runner = Runner(request, process, self, placement)
        runner.start()
        self.by_key[request.key] = runner
        self._alive[runner] = None
        return runner

    def stopping(self) -> list[Runner]:
        """Runners told to stop whose process has not ended yet: their slots and memory still count."""
        return [runner for runner in self._alive if runner.state is State.STOPPING]

    def fits(self, memory: int, limits: Limits, footprint: Footprint | None = None) -> bool:
        """Whether a runner of C{memory} bytes fits now beside every other, without stopping one.

        With GPUs in C{limits}, C{footprint} is placed as the plan would place it in what each has free.
        """
        if limits.gpus and footprint is not None:
            held = self.on_gpus()
            free = {device: budget - held.get(device, 0) for device, budget in limits.gpus}
            placement = placing.place(footprint, free, list(free))
            if any(size > free[device] for device, size in placement.on_gpus.items()):
                return False
            memory = placement.in_ram
        used = sum(runner.memory for runner in self._alive)
        budget = limits.memory_budget
        return len(self._alive) < limits.max_runners and (not budget or used + memory <= budget)

    def on_gpus(self) -> dict[str, int]:
        """Bytes every runner together holds on each GPU."""
        held: dict[str, int] = {}
        for runner in self._alive:
            for device, size in runner.on_gpus.items():
                held[device] = held.get(device, 0) + size
        return held

    def when_empty(self) -> Deferred[None]:
        """Fires once every runner's process has ended."""
        if not self._alive:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._empty.append(d)
        return d

    def left(self, runner: Runner) -> None:
        if self.by_key.get(runner.key) is runner:
            del self.by_key[runner.key]

    def gone(self, runner: Runner) -> None:
        del self._alive[runner]
        if not self._alive:
            waiters, self._empty = self._empty, []
            for d in waiters:
                d.callback(None)
