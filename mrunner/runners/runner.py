"""A runner: the core its machine (L{mrunner.runners.lifecycle}) acts on.

Its inputs are the methods named after them (the loader's) and the
callbacks of its process and timers; every side effect of a move (its
process spawned, probed, stopped or killed, a timer armed or cancelled, its
slots counted, its events told) is one of the outputs below, run by the
table and nowhere else. The loader sends inputs and reads the views; it
sets nothing.
"""

from __future__ import annotations

from typing import Protocol

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mrunner.interfaces import ILoaderEvents, IRunnerProcess
from mrunner.runners import lifecycle
from mrunner.runners.holding import GpuUse, Measured, held_on_gpus
from mrunner.runners.lifecycle import Input, Stage
from mrunner.runners.request import LoadRequest
from mrunner.values import Placement, RunnerKey, State

#: Seconds before the first poll of a loading runner's health after a "not yet", and the most between two.
POLL_FIRST = 0.02
POLL_MAX = 0.25


class Keeper(Protocol):
    """What a runner's moves tell the loader that keeps it."""

    def opened(self, runner: Runner) -> None:
        """It became ready: its key's load back-off is over."""

    def failed(self, runner: Runner, reason: Failure) -> None:
        """It could not start: back off its key, fail the requests waiting for it."""

    def replan(self) -> None:
        """Something the plan decides from changed; plan again (unless shutting down)."""


class Roll(Protocol):
    """Where a runner is kept (L{mrunner.scheduling.roster.Roster}): the clock, the events, the
    keeper, NVML, and the two ways out of the records."""

    clock: IReactorTime
    events: ILoaderEvents
    keeper: Keeper
    gpu_use: GpuUse

    def left(self, runner: Runner) -> None:
        """No new request finds it by its key."""

    def gone(self, runner: Runner) -> None:
        """Its process has ended: out of the records."""


class Runner:
    """One runner process and its machine; its fields change only by its machine's moves."""

    log = Logger()

    def __init__(
        self,
        request: LoadRequest,
        process: IRunnerProcess,
        roll: Roll,
        placement: Placement | None = None,
    ):
        # It outlives the request that started it: not that request's prompt (issue 53 M1).
        self.request = attrs.evolve(request, conversation=()) if request.conversation else request
        self.process = process
        #: Where the plan put its layers; None on a machine without GPUs.
        self.placement = placement
        self._roll = roll
        self.stage = Stage.NEW
        self.in_use = 0
        self.started = roll.clock.seconds()
        self.finished_at = 0.0  # when it last became idle: none yet
        self.loaded_at = 0.0  # when it became ready: not yet
        #: Requests it has taken since it became ready.
        self.served = 0
        self.measured = Measured()
        #: Seconds of idling before it goes (-1: never, 0: at once); a pinned runner never goes.
        self.keep_alive = request.keep_alive
        self.pinned = request.pinned
        # Its timers, each armed and cancelled only by the outputs of the same names.
        self._deadline: IDelayedCall | None = None
        self._poll: IDelayedCall | None = None
        self._delay = POLL_FIRST
        self._probing: Deferred[bool] | None = None  # the probe whose answer is awaited
        self._expiry: IDelayedCall | None = None
        self._grace: IDelayedCall | None = None
        self._terms: tuple[float | None, bool | None] = (None, None)  # what an input brought (take_terms)
        self._failure: Failure | None = None

    # Inputs

    def start(self) -> None:
        """Spawn its process and look for its health until its load deadline.

        @raise Exception: the process could not be spawned (the runner is then to be dropped).
        """
        self._move(Input.START)

    def lease(self, keep_alive: float | None = None) -> None:
        """A request takes a slot; C{keep_alive}, when it brings one, is the runner's from now on."""
        self._terms = (keep_alive, None)
        self._move(Input.LEASE)

    def release(self) -> None:
        self._move(Input.RELEASE)

    def rest(self) -> None:
        """The loader has nothing for it: if it is ready and idle, its keep-alive runs from now."""
        self._move(Input.REST)

    def retime(self, keep_alive: float | None = None, pinned: bool | None = None) -> None:
        """A new keep-alive or pin (None: as it was), its clock started again if it is idle."""
        self._terms = (keep_alive, pinned)
        self._move(Input.RETIME)

    def drain(self) -> None:
        self._move(Input.DRAIN)

    def stop(self) -> None:
        self._move(Input.STOP)

    def when_ended(self) -> Deferred[None]:
        """A new Deferred that fires once its process has ended."""
        d: Deferred[None] = Deferred()

        def ended(result: object) -> object:
            d.callback(None)
            return result

        self.process.ended.addBoth(ended)
        return d

    # Inputs from its process and its timers

    def _polled(self) -> None:
        self._poll = None
        self._move(Input.POLL)

    def _spoke(self) -> None:
        if self._poll is not None:  # a probe is awaited otherwise, and will be answered
            self._move(Input.SPOKE)

    def _checked(self, healthy: bool, probe: Deferred[bool]) -> None:
        if probe is self._probing:  # else the answer to a probe sent before it stopped loading
            self._probing = None
            self._move(Input.ANSWER if healthy else Input.UNHEALTHY)

    def _check_failed(self, reason: Failure, probe: Deferred[bool]) -> None:
        if probe is self._probing:
            self._probing = None
            self._failure = reason
            self._move(Input.FAIL)

    def _timed_out(self) -> None:
        self._deadline = None
        seconds = self.process.options.load_timeout
        why = f"was not ready after {seconds:g}s; raise [scheduler] load_timeout"
        self._failure = Failure(self.process.failure(why))
        self._move(Input.TIME_OUT)

    def _expire(self) -> None:
        self._expiry = None
        self.log.info("runner {key} idle for its keep-alive; stopping", key=self.key)
        self._move(Input.EXPIRE)

    def _grace_over(self) -> None:
        self._grace = None
        self._move(Input.GRACE_OVER)

    def _ended(self, result: object) -> object:
        self._move(Input.END)
        return result

    def _move(self, input: Input) -> None:
        lifecycle.step(self, input)

    # Outputs (L{lifecycle.Effects})

    def spawn(self) -> None:
        self.process.start(self._spoke)
        self.process.ended.addBoth(self._ended)

    def arm_deadline(self) -> None:
        self._deadline = self._roll.clock.callLater(self.process.options.load_timeout, self._timed_out)

    def probe(self) -> None:
        self._probing = probe = self.process.healthy()
        probe.addCallbacks(self._checked, self._check_failed, callbackArgs=(probe,), errbackArgs=(probe,))

    def poll_later(self) -> None:
        self._poll = self._roll.clock.callLater(self._delay, self._polled)
        self._delay = min(self._delay * 1.5, POLL_MAX)

    def poll_soon(self) -> None:
        call = self._poll
        if call is not None and call.getTime() - self._roll.clock.seconds() > POLL_FIRST:
            call.reset(POLL_FIRST)

    def cancel_load_timers(self) -> None:
        for call in (self._deadline, self._poll):
            if call is not None:
                call.cancel()
        self._deadline = self._poll = self._probing = None

    def opened(self) -> None:
        self.process.opened()
        self.finished_at = self.loaded_at = self._roll.clock.seconds()
        self._roll.events.loaded(self.key, self.model_name, self.load_seconds)
        self._measure()
        self._roll.keeper.opened(self)

    def take_slot(self) -> None:
        self.in_use += 1
        self.served += 1

    def give_slot(self) -> None:
        self.in_use -= 1
        if self.in_use == 0:
            self.finished_at = self._roll.clock.seconds()
            if self.measured.due(self.finished_at):
                self._measure()

    def take_terms(self) -> None:
        (keep_alive, pinned), self._terms = self._terms, (None, None)
        if keep_alive is not None:
            self.keep_alive = keep_alive
        if pinned is not None:
            self.pinned = pinned

    def arm_expiry(self) -> None:
        if self.in_use or self.pinned or self._expiry is not None:
            return
        if self.keep_alive == 0:
            self.log.info("runner {key} has a keep-alive of 0; stopping", key=self.key)
            self._move(Input.EXPIRE)
        elif self.keep_alive > 0:
            self._expiry = self._roll.clock.callLater(self.keep_alive, self._expire)

    def cancel_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def expired(self) -> None:
        self._roll.events.evicted(self.key, self.model_name, "idle")

    def leave(self) -> None:
        self._roll.left(self)

    def report_failure(self) -> None:
        """Its deadline or check gave the reason; else its process ended while it loaded."""
        why = f"{self.process.how} before it was ready"
        reason = self._failure or Failure(self.process.failure(why))
        self._roll.events.load_failed(self.key, self.model_name)
        self._roll.keeper.failed(self, reason)

    def stop_process(self) -> None:
        self._grace = self._roll.clock.callLater(self.process.options.stop_grace, self._grace_over)
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()

    def cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def crashed(self) -> None:
        self.log.warn("runner {key} exited unexpectedly; evicted", key=self.key)

    def evicted_crash(self) -> None:
        self._roll.events.evicted(self.key, self.model_name, "crash")

    def exited_failed(self) -> None:
        self._roll.events.exited(self.key, self.model_name, "failed")

    def exited_crashed(self) -> None:
        self._roll.events.exited(self.key, self.model_name, "crashed")

    def exited_stopped(self) -> None:
        self._roll.events.exited(self.key, self.model_name, "stopped")

    def gone(self) -> None:
        self._roll.gone(self)

    def replan(self) -> None:
        self._roll.keeper.replan()

    def _measure(self) -> None:
        self.measured.take(self.process, self._roll.gpu_use, self._roll.clock.seconds())

    # Views (L{mrunner.scheduling.policy.RunnerView} and the snapshots)

    @property
    def state(self) -> State:
        return self.stage.state

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
    def expires_at(self) -> float | None:
        """When its keep-alive timer fires; None when none runs."""
        return self._expiry.getTime() if self._expiry is not None else None

    @property
    def load_seconds(self) -> float:
        """How long its load took, from spawn to ready; 0 until it is ready."""
        return self.loaded_at - self.started if self.loaded_at else 0.0

    @property
    def has_room(self) -> bool:
        """Whether it can take a request now, so that request need not wait in the queue."""
        return self.stage is Stage.READY and self.in_use < self.parallel

    @property
    def memory(self) -> int:
        """What the budget counts: the estimate, or the measured resident memory once larger
        (L{Measured}). The estimate stays the floor: resident memory counts only pages touched so
        far, and buffers llama-server has allocated but not yet used are touched by the first long prompt.
        """
        estimate = self.request.memory if self.placement is None else self.placement.in_ram
        return max(estimate, self.measured.rss)

    @property
    def on_gpus(self) -> dict[str, int]:
        """Bytes it holds on each GPU: as planned, or what its load output or NVML gave once larger.

        Like L{memory}, the estimate stays the floor (L{held_on_gpus}).
        """
        planned = {} if self.placement is None else self.placement.on_gpus
        return held_on_gpus(planned, self.process.load_report.buffers, self.measured.gpus)

    @property
    def gpu_layers(self) -> int:
        return 0 if self.placement is None else self.placement.gpu_layers
