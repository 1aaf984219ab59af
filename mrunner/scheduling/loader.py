"""Keeps runners: loads them on demand, shares them, queues requests, evicts idle ones.

All state lives here and changes only on the reactor; what to do next is
decided by L{policy.plan}, so the rules are tested without processes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, DeferredList, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mrunner.backends.base import RunnerSettings
from mrunner.errors import MrunnerError, RunnerFailed, Unavailable
from mrunner.interfaces import ILease, ILoaderEvents, IRunnerProcess
from mrunner.scheduling import policy
from mrunner.scheduling.lifecycle import Lifecycle
from mrunner.scheduling.policy import Limits
from mrunner.store.model import Model
from mrunner.values import RunnerKey, State

NEVER = -1.0
#: Seconds between two readings of a runner's resident memory, which is read from /proc when it goes idle.
MEASURE_EVERY = 1.0
SHUTTING_DOWN = "mrunner is shutting down; try again once it has restarted"


Spawn = Callable[[RunnerKey, Model, RunnerSettings], IRunnerProcess]


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


@attrs.define(eq=False)
class Runner:
    """The loader's record of one runner process; its state is its L{Lifecycle}'s."""

    request: LoadRequest
    process: IRunnerProcess
    lifecycle: Lifecycle = attrs.field(factory=Lifecycle)
    in_use: int = 0
    finished_at: float = 0.0
    expiry: IDelayedCall | None = None
    measured: int = 0
    measured_at: float = -MEASURE_EVERY
    started: float = 0.0
    failed: bool = False  # it never became ready
    keep_alive: float = attrs.field()
    pinned: bool = attrs.field()

    @keep_alive.default
    def _keep_alive(self) -> float:
        return self.request.keep_alive

    @pinned.default
    def _pinned(self) -> bool:
        return self.request.pinned

    @property
    def state(self) -> State:
        return self.lifecycle.state

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
    def memory(self) -> int:
        """What the budget counts: the estimate, or the measured resident memory once larger.

        Measured when the runner is ready and when it goes idle, at most
        once every L{MEASURE_EVERY} seconds (a busy runner goes idle after
        each request). The
        estimate stays the floor: resident memory counts only pages touched
        so far, and buffers llama-server has allocated but not yet used are
        touched by the first long prompt.
        """
        return max(self.request.memory, self.measured)


@attrs.define(eq=False)
class _Waiter:
    request: LoadRequest
    deferred: Deferred[Lease]

    @property
    def key(self) -> RunnerKey:
        return self.request.key

    @property
    def memory(self) -> int:
        return self.request.memory


@implementer(ILease)
class Lease:
    """A request's hold on one of a runner's parallel slots: where to send it, and C{release}."""

    def __init__(self, runner: Runner, release: Callable[[Runner], None]):
        self.socket = runner.socket
        self.model = runner.request.model.name
        self._runner: Runner | None = runner
        self._release = release

    def release(self) -> None:
        """Give the slot back; only the first call counts."""
        runner, self._runner = self._runner, None
        if runner is not None:
            self._release(runner)


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


@attrs.define
class _Backoff:
    delay: float
    until: float


class Loader:
    """Hands out L{Lease}s on runners within the L{Limits} and a bounded FIFO queue."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        spawn: Spawn,
        limits: Limits,
        max_queue: int,
        events: ILoaderEvents | None = None,
    ):
        self._clock = clock
        self._events: ILoaderEvents = events or NoEvents()
        self._spawn = spawn
        self._limits = limits
        self._max_queue = max_queue
        self.runners: dict[RunnerKey, Runner] = {}
        self._stopping: set[Runner] = set()  # in STOPPING: out of `runners`, memory counted until ENDED
        self._queue: deque[_Waiter] = deque()
        self._backoff: dict[RunnerKey, _Backoff] = {}
        self._closed = False
        self._pumping = False
        self._repump = False
        self._all_ended: list[Deferred[None]] = []

    @property
    def queued(self) -> int:
        return len(self._queue)

    def reconfigure(self, limits: Limits, max_queue: int) -> None:
        """New limits from a reloaded configuration, applied at once; no runner is stopped for them."""
        self._limits = limits
        self._max_queue = max_queue
        self._pump()

    def fits(self, memory: int) -> bool:
        """Whether a runner of C{memory} bytes fits now beside every other, without stopping one."""
        used = sum(r.memory for r in self.runners.values()) + sum(self._stopping_memory())
        slots = len(self.runners) + len(self._stopping)
        budget = self._limits.memory_budget
        return slots < self._limits.max_runners and (not budget or used + memory <= budget)

    def acquire(self, request: LoadRequest) -> Deferred[Lease]:
        """A lease on a ready runner for C{request.key}; cancel it to leave the queue."""
        if self._closed:
            return fail(Unavailable(SHUTTING_DOWN, code="shutting_down"))
        backoff = self._backoff.get(request.key)
        if backoff is not None and self._clock.seconds() < backoff.until:
            return fail(
                Unavailable(
                    f"model {request.model.name} failed to load recently; retrying is paused, try again soon",
                    code="load_backoff",
                    retry_after=backoff.until - self._clock.seconds(),
                )
            )
        runner = self.runners.get(request.key)
        room = runner is not None and _has_room(runner)
        if len(self._queue) >= self._max_queue and not room:
            return fail(
                Unavailable(
                    f"too many requests waiting ({self._max_queue}); try again shortly",
                    code="queue_full",
                    retry_after=1.0,
                )
            )
        if not self._queue and runner is not None and room:
            return succeed(self._lease(runner, request))  # the common case: no one to plan for
        waiter = _Waiter(request, Deferred(lambda d: self._leave(waiter)))
        self._queue.append(waiter)
        if runner is None or room:
            # A waiter for a runner that exists but has no free slot changes no decision:
            # the plan passes over it until that runner frees a slot (see _release).
            self._pump()
        return waiter.deferred

    def unload(self, match: Callable[[RunnerKey], bool]) -> Deferred[Any]:
        """Stop idle runners that C{match}; drain busy ones. Fires when the idle ones have exited.

        A draining runner can serve a long stream for minutes: the caller is
        not kept waiting for it.
        """
        ended = []
        for runner in [r for r in self.runners.values() if match(r.key)]:
            if runner.in_use:
                if runner.state is State.READY:
                    self._evicted(runner, "unload")
                    runner.lifecycle.drain()
            else:
                ended.append(self._when_ended(runner))
                self._evicted(runner, "unload")
                self._stop(runner)
        self._pump()
        return DeferredList(ended)

    def keep_alive(self, match: Callable[[RunnerKey], bool], seconds: float) -> None:
        """Give the runners that C{match} a new keep-alive, counted from now if they are idle."""
        self._retime(match, keep_alive=seconds)

    def pin(self, match: Callable[[RunnerKey], bool], pinned: bool) -> None:
        """Pin the runners that C{match} (no expiry, no eviction), or let them go again."""
        self._retime(match, pinned=pinned)

    def _retime(self, match: Callable[[RunnerKey], bool], **changes: Any) -> None:
        """Change what decides the expiry of the runners that C{match}, and restart their clocks."""
        for runner in list(self.runners.values()):
            if match(runner.key):
                for name, value in changes.items():
                    setattr(runner, name, value)
                _cancel_expiry(runner)
                self._sync_expiry(runner)

    def close(self) -> Deferred[None]:
        """Refuse new work, fail the queue, stop every runner; fire when all have exited."""
        self._closed = True
        while self._queue:
            self._queue.popleft().deferred.errback(Unavailable(SHUTTING_DOWN, code="shutting_down"))
        for runner in list(self.runners.values()):
            self._stop(runner)
        if not self.runners and not self._stopping:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._all_ended.append(d)
        return d

    @staticmethod
    def _when_ended(runner: Runner) -> Deferred[None]:
        d: Deferred[None] = Deferred()

        def ended(result: object) -> object:
            d.callback(None)
            return result

        runner.process.ended.addBoth(ended)
        return d

    def _leave(self, waiter: _Waiter) -> None:
        self._queue.remove(waiter)
        self._pump()

    def _lease(self, runner: Runner, request: LoadRequest) -> Lease:
        runner.in_use += 1
        if request.sets_keep_alive:
            runner.keep_alive = request.keep_alive
        self._sync_expiry(runner)
        return Lease(runner, self._release)

    def _release(self, runner: Runner) -> None:
        runner.in_use -= 1
        if runner.in_use == 0:
            runner.finished_at = self._clock.seconds()
            if runner.finished_at - runner.measured_at >= MEASURE_EVERY:
                self._measure(runner)
        if runner.state is not State.READY:
            self._pump()
        elif not self._queue:
            self._sync_expiry(runner)  # with no one waiting, the plan would decide nothing
        elif self._queue[0].key == runner.key:
            # The plan serves the queue in order and free slots first: the head takes this slot.
            waiter = self._queue.popleft()
            waiter.deferred.callback(self._lease(runner, waiter.request))
        else:
            self._pump()

    def _measure(self, runner: Runner) -> None:
        runner.measured = runner.process.rss() or runner.measured
        runner.measured_at = self._clock.seconds()

    def _pump(self) -> None:
        """Carry out what the policy decides, until it decides nothing new.

        Acting can call back in (a lease handed out is released at once, a
        stopped process exits): such a call only asks for one more round, so
        every round acts on a decision made from the state as it is.
        """
        self._repump = True
        if self._pumping:
            return
        self._pumping = True
        try:
            while self._repump:
                self._repump = False
                self._act(policy.plan(self._queue, self.runners, self._stopping_memory(), self._limits))
        finally:
            self._pumping = False

    def _stopping_memory(self) -> list[int]:
        return [runner.memory for runner in self._stopping]

    def _act(self, decision: policy.Plan[_Waiter, RunnerKey]) -> None:
        for waiter in decision.assign:
            runner = self.runners.get(waiter.key)
            if waiter in self._queue and runner is not None and runner.in_use < runner.parallel:
                self._queue.remove(waiter)
                waiter.deferred.callback(self._lease(runner, waiter.request))
        for key in decision.evict:
            victim = self.runners.get(key)
            if victim is not None and victim.in_use == 0:
                self.log.info("evicting idle runner {key} to make room", key=key)
                self._evicted(victim, "memory")
                self._stop(victim)
        for key in decision.drain:
            runner = self.runners.get(key)
            if runner is not None and runner.state is State.READY:
                self.log.info("draining busy runner {key} to make room", key=key)
                self._evicted(runner, "memory")
                runner.lifecycle.drain()
        for waiter in decision.load:
            if waiter.key not in self.runners:
                self._load(waiter.request)
        for key in policy.drained(self.runners):
            self._stop(self.runners[key])
        for runner in list(self.runners.values()):
            self._sync_expiry(runner)

    def _sync_expiry(self, runner: Runner) -> None:
        """Start C{runner}'s keep-alive clock if it is idle, else stop it; keep-alive 0 stops it now.

        A pinned runner has no keep-alive clock.
        """
        if runner.state is not State.READY or runner.in_use or runner.pinned:
            _cancel_expiry(runner)
        elif runner.keep_alive == 0:
            self._evicted(runner, "idle")
            self._stop(runner)
        elif runner.expiry is None and runner.keep_alive > 0:
            runner.expiry = self._clock.callLater(runner.keep_alive, self._expire, runner)

    def _expire(self, runner: Runner) -> None:
        runner.expiry = None
        self.log.info("runner {key} idle for its keep-alive; stopping", key=runner.key)
        self._evicted(runner, "idle")
        self._stop(runner)
        self._pump()

    def _load(self, request: LoadRequest) -> None:
        self.log.info("loading {model} for {key}", model=request.model.name, key=request.key)
        try:
            process = self._spawn(request.key, request.model, request.settings)
        except MrunnerError as e:
            self._events.load_failed(request.key, request.model.name)
            self._fail_waiters(request.key, Failure(e))  # e.g. a model the backend cannot serve
            return
        except Exception as e:
            self._events.load_failed(request.key, request.model.name)
            error = RunnerFailed(f"mrunner could not start a runner for {request.model.name}: {e}")
            self._fail_waiters(request.key, Failure(error))
            return
        runner = Runner(request, process, started=self._clock.seconds())
        self.runners[request.key] = runner
        process.ready.addCallbacks(
            self._loaded, self._load_failed, callbackArgs=(runner,), errbackArgs=(runner,)
        )
        process.ended.addBoth(self._exited, runner)

    def _loaded(self, result: object, runner: Runner) -> None:
        self._backoff.pop(runner.key, None)
        runner.lifecycle.ready()
        runner.finished_at = self._clock.seconds()
        self._events.loaded(runner.key, runner.model_name, runner.finished_at - runner.started)
        self._measure(runner)
        self._pump()

    def _load_failed(self, reason: Failure, runner: Runner) -> None:
        if runner.state is not State.LOADING:
            return  # stopped on purpose; its waiters stay queued for the next load
        key = runner.key
        runner.failed = True
        self._events.load_failed(key, runner.model_name)
        previous = self._backoff.get(key)
        delay = policy.next_backoff(previous.delay if previous else None)
        self._backoff[key] = _Backoff(delay, self._clock.seconds() + delay)
        self.log.warn(
            "runner {key} failed to load ({error}); backing off {delay}s",
            key=key,
            error=reason.getErrorMessage(),
            delay=delay,
        )
        self._fail_waiters(key, reason)  # first: stopping it must not start a load for them
        self._stop(runner)
        self._pump()

    def _fail_waiters(self, key: RunnerKey, reason: Failure) -> None:
        for waiter in [w for w in self._queue if w.key == key]:
            self._queue.remove(waiter)
            waiter.deferred.errback(reason)

    def _exited(self, result: object, runner: Runner) -> None:
        """A runner's process is gone, stopped or crashed: it no longer exists."""
        previous = runner.lifecycle.end()
        if previous in (State.READY, State.DRAINING):
            self.log.warn("runner {key} exited unexpectedly; evicted", key=runner.key)
            if previous is State.READY:  # a draining one was counted when it began to drain
                self._evicted(runner, "crash")
        self._events.exited(runner.key, runner.model_name, _exit_cause(runner, previous))
        self._forget(runner)
        self._stopping.discard(runner)
        if not self.runners and not self._stopping:
            waiters, self._all_ended = self._all_ended, []
            for d in waiters:
                d.callback(None)
        if not self._closed:
            self._pump()

    def _evicted(self, runner: Runner, reason: str) -> None:
        self._events.evicted(runner.key, runner.model_name, reason)

    def _forget(self, runner: Runner) -> None:
        if self.runners.get(runner.key) is runner:
            del self.runners[runner.key]
        _cancel_expiry(runner)

    def _stop(self, runner: Runner) -> None:
        """SIGTERM it (SIGKILL later): it leaves C{runners}, its memory counts until it has ended."""
        self._forget(runner)
        if runner.lifecycle.running:
            runner.lifecycle.stop()
            self._stopping.add(runner)
            runner.process.stop()


def _exit_cause(runner: Runner, previous: State) -> str:
    """C{failed} if it never became ready, C{stopped} if asked to stop, else C{crashed}."""
    if runner.failed or previous is State.LOADING:
        return "failed"
    return "stopped" if previous is State.STOPPING else "crashed"


def _cancel_expiry(runner: Runner) -> None:
    if runner.expiry is not None:
        runner.expiry.cancel()
        runner.expiry = None


def _has_room(runner: Runner) -> bool:
    """Whether C{runner} can take a request now, so that request need not wait in the queue."""
    return runner.state is State.READY and runner.in_use < runner.parallel
