"""The loader's records of its runners: one L{Runner} each, kept in a L{Roster}.

A L{Runner} is the core its machine (L{mrunner.scheduling.lifecycle}) acts
on: its inputs are the methods named after them, and every side effect of a
move (its process stopped, its keep-alive cancelled, its slots counted, its
events told) is one of the outputs below, run by the table and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mrunner.interfaces import ILoaderEvents, IRunnerProcess
from mrunner.scheduling import lifecycle, policy
from mrunner.scheduling.keepalive import KeepAlive
from mrunner.scheduling.lifecycle import Input
from mrunner.scheduling.policy import Limits
from mrunner.values import ContextSize, Footprint, Placement, RunnerKey, State
from mrunner.values.backend import RunnerSettings
from mrunner.values.model import Model

#: Seconds between two readings of a runner's resident memory (from /proc) and its use of each GPU
#: (from NVML), which are read when it goes idle.
MEASURE_EVERY = 1.0

#: NVML's bytes for a process on each GPU (L{mrunner.interfaces.IDevices.used_by}).
GpuUse = Callable[[int], Mapping[str, int]]


def unmeasured(pid: int) -> dict[str, int]:
    """No GPU use measured: a machine without NVML."""
    return {}


@attrs.frozen
class LoadRequest:
    """What a request needs: the runner key and how to start it if it is not running."""

    key: RunnerKey
    model: Model
    settings: RunnerSettings
    keep_alive: float
    memory: int = 0
    sets_keep_alive: bool = False
    pinned: bool = False
    #: C{memory} split per layer, for a plan over GPUs; None: all of it in RAM.
    footprint: Footprint | None = None
    #: How many runners of the model may serve (C{[models."NAME"] instances}).
    instances: int = 1
    #: The context in force when the user fixed no context size, which a load out of device
    #: memory may halve once (C{settings.context_size} then holds the half); None when fixed.
    context: ContextSize | None = None

    @property
    def halved(self) -> bool:
        """Whether a load out of device memory halved the context the user left to mrunner."""
        return self.context is not None and self.settings.context_size is not None

    @property
    def asked(self) -> RunnerSettings:
        """The settings as configured, before a load out of device memory halved the context."""
        return attrs.evolve(self.settings, context_size=None) if self.halved else self.settings


class Keeper(Protocol):
    """What a runner's moves tell the loader that keeps it."""

    def opened(self, runner: Runner) -> None:
        """It became ready: its key's load back-off is over."""

    def failed(self, runner: Runner, reason: Failure) -> None:
        """It could not start: back off its key, fail the requests waiting for it."""

    def replan(self) -> None:
        """Something the plan decides from changed; plan again (unless shutting down)."""


class Runner:
    """The loader's record of one runner process; its state changes only by its machine's moves."""

    log = Logger()

    def __init__(
        self,
        request: LoadRequest,
        process: IRunnerProcess,
        roster: Roster,
        placement: Placement | None = None,
    ):
        self.request = request
        self.process = process
        #: Where the plan put its layers; None on a machine without GPUs.
        self.placement = placement
        self._roster = roster
        self.state = State.LOADING
        self.in_use = 0
        self.started = roster.clock.seconds()
        self.finished_at = 0.0  # when it last became idle: none yet
        self.measured = 0
        #: NVML's bytes for its process on each GPU, when last read; none without NVML.
        self.measured_gpus: Mapping[str, int] = {}
        self.measured_at = -MEASURE_EVERY
        self.expiry = KeepAlive(roster.clock, request.keep_alive, request.pinned)
        self._exit_cause = "failed"  # how its end is told: set by L{opened} and L{asked_to_stop}
        self._failure: Failure | None = None

    # Inputs

    def answer(self) -> None:
        self._move(Input.ANSWER)

    def fail(self, reason: Failure) -> None:
        self._failure = reason
        self._move(Input.FAIL)

    def lease(self) -> None:
        self._move(Input.LEASE)

    def release(self) -> None:
        self._move(Input.RELEASE)

    def drain(self) -> None:
        self._move(Input.DRAIN)

    def stop(self) -> None:
        self._move(Input.STOP)

    def end(self) -> None:
        self._move(Input.END)

    def _move(self, input: Input) -> None:
        lifecycle.step(self, input)

    # Outputs (L{lifecycle.Effects})

    def opened(self) -> None:
        self._exit_cause = "crashed"  # from now on, an end it was not asked for is a crash
        self.finished_at = self._roster.clock.seconds()
        self._roster.events.loaded(self.key, self.model_name, self.finished_at - self.started)
        self._measure()
        self._roster.keeper.opened(self)

    def take_slot(self) -> None:
        self.in_use += 1

    def give_slot(self) -> None:
        self.in_use -= 1
        if self.in_use == 0:
            self.finished_at = self._roster.clock.seconds()
            if self.finished_at - self.measured_at >= MEASURE_EVERY:
                self._measure()

    def cancel_expiry(self) -> None:
        self.expiry.cancel()

    def leave(self) -> None:
        self._roster.left(self)

    def asked_to_stop(self) -> None:
        self._exit_cause = "stopped"

    def report_failure(self) -> None:
        assert self._failure is not None
        self._roster.events.load_failed(self.key, self.model_name)
        self._roster.keeper.failed(self, self._failure)

    def stop_process(self) -> None:
        self.process.stop()

    def crashed(self) -> None:
        self.log.warn("runner {key} exited unexpectedly; evicted", key=self.key)

    def evicted_crash(self) -> None:
        self._roster.events.evicted(self.key, self.model_name, "crash")

    def exited(self) -> None:
        self._roster.events.exited(self.key, self.model_name, self._exit_cause)
        self._roster.gone(self)

    def replan(self) -> None:
        self._roster.keeper.replan()

    def _measure(self) -> None:
        self.measured = self.process.rss() or self.measured
        pid = self.process.pid
        if pid is not None:
            self.measured_gpus = self._roster.gpu_use(pid) or self.measured_gpus
        self.measured_at = self._roster.clock.seconds()

    # Views (L{policy.RunnerView} and the snapshots)

    @property
    def key(self) -> RunnerKey:
        return self.request.key

    @property
    def parallel(self) -> int:
        return self.request.settings.parallel

    @property
    def socket(self) -> str:
        return self.process.socket

    @property
    def model_name(self) -> str:
        return self.request.model.name

    @property
    def keep_alive(self) -> float:
        return self.expiry.seconds

    @property
    def pinned(self) -> bool:
        return self.expiry.pinned

    @property
    def has_room(self) -> bool:
        """Whether it can take a request now, so that request need not wait in the queue."""
        return self.state is State.READY and self.in_use < self.parallel

    @property
    def memory(self) -> int:
        """What the budget counts: the estimate, or the measured resident memory once larger.

        Measured when the runner is ready and when it goes idle, at most
        once every L{MEASURE_EVERY} seconds (a busy runner goes idle after
        each request). The estimate stays the floor: resident memory counts
        only pages touched so far, and buffers llama-server has allocated
        but not yet used are touched by the first long prompt.
        """
        estimate = self.request.memory if self.placement is None else self.placement.in_ram
        return max(estimate, self.measured)

    @property
    def on_gpus(self) -> dict[str, int]:
        """Bytes it holds on each GPU: as planned, or what its load output or NVML gave once larger.

        Like L{memory}, the estimate stays the floor (L{policy.held_on_gpus}).
        """
        planned = {} if self.placement is None else self.placement.on_gpus
        return policy.held_on_gpus(planned, self.process.load_report.buffers, self.measured_gpus)

    @property
    def gpu_layers(self) -> int:
        return 0 if self.placement is None else self.placement.gpu_layers


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
        """Record C{process}, just started for C{request} (its layers where C{placement} says);
        its Deferreds drive the runner's machine."""
        runner = Runner(request, process, self, placement)
        self.by_key[request.key] = runner
        self._alive[runner] = None
        process.ready.addCallbacks(lambda _: runner.answer(), runner.fail)
        process.ended.addBoth(lambda _: runner.end())
        return runner

    def stopping(self) -> list[Runner]:
        """Runners told to stop whose process has not ended yet: their slots and memory still count."""
        return [runner for runner in self._alive if runner.state is State.STOPPING]

    def fits(self, memory: int, limits: Limits) -> bool:
        """Whether a runner of C{memory} bytes fits now beside every other, without stopping one."""
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
