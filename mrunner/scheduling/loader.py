"""Keeps runners: loads them on demand, shares them, queues requests, evicts idle ones.

All state lives on the reactor: the queue here, the back-offs in
L{backoff}, each runner's in its own L{mrunner.runners.runner.Runner}, which
only its machine (L{mrunner.runners.lifecycle}) changes. What to do next is
decided by L{policy.plan}, so the rules are tested without processes; the
loader applies the plans and sends each runner's machine its inputs (lease,
release, rest, retime, drain, stop); it reads their states and sets nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, DeferredList, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mrunner.errors import MrunnerError, RunnerFailed, Unavailable
from mrunner.interfaces import IDevices, ILoaderEvents, IRunnerProcess
from mrunner.runners.holding import unmeasured
from mrunner.runners.request import LoadRequest
from mrunner.runners.runner import Runner
from mrunner.scheduling import policy, priority, refusals, smaller
from mrunner.scheduling.backoff import Backoffs
from mrunner.scheduling.gate import Gate
from mrunner.scheduling.lease import Lease, Waiter, first, instances, least_busy
from mrunner.scheduling.load_times import LoadTimes
from mrunner.scheduling.order import Rules
from mrunner.scheduling.pacing import Pacing
from mrunner.scheduling.policy import Limits
from mrunner.scheduling.roster import NoEvents, Roster
from mrunner.scheduling.smaller import Estimate, same_estimate
from mrunner.scheduling.waitqueue import WaitQueue
from mrunner.values import Footprint, Placement, RunnerKey, State, Waiting
from mrunner.values.backend import RunnerSettings
from mrunner.values.model import Model

Spawn = Callable[[RunnerKey, Model, RunnerSettings], IRunnerProcess]
#: Of the running instances a request may use, the one to serve it rather than the least busy
#: (the prompt cache's: the one whose slot holds its conversation); None: no preference.
Prefer = Callable[[LoadRequest, list[Runner]], Runner | None]


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
        devices: IDevices | None = None,
        starvation: float = 60.0,
        estimate: Estimate = same_estimate,
        rules: Rules | None = None,
        load_times: LoadTimes | None = None,
    ):
        self._clock = clock
        self._estimate = estimate
        #: Each GPU's budget, as the devices last pushed them (L{IDevices.watch}); none without GPUs.
        self.gpus: tuple[tuple[str, int], ...] = ()
        #: How the queue is served between models (L{patience}, C{starvation} in its rules).
        rules = attrs.evolve(rules or Rules(), starvation=starvation)
        self.pacing = Pacing(rules, load_times or LoadTimes(), self.replan)
        self._spawn = spawn
        self._limits = limits
        self.roster = Roster(clock, events or NoEvents(), self, devices.used_by if devices else unmeasured)
        #: The runner each key's requests go to (the roster's; stopping ones are not in it).
        self.runners = self.roster.by_key
        self._queue = WaitQueue(max_queue)
        self._backoff = Backoffs(clock)
        #: Open, draining or closed, and the leases held (L{gate}).
        self._gate = Gate()
        #: Which running instance serves a request that need not wait (L{Prefer}); the wiring's to set.
        self.prefer: Prefer = lambda request, running: None
        self._pumping = False
        self._repump = False
        if devices is not None:
            devices.watch(self._budgets)

    @property
    def starvation(self) -> float:
        """Seconds of waiting after which a waiter moves up a priority class (L{priority})."""
        return self.pacing.rules.starvation

    @property
    def queued(self) -> int:
        return len(self._queue)

    def waiting(self) -> list[Waiting]:
        """How many wait for each model, and how long the oldest has."""
        return self._queue.waiting(self._clock.seconds())

    def ahead(self, waiting: Deferred[Lease]) -> int | None:
        """How many are served before the waiter C{waiting} is for (L{ahead}); None once not queued."""
        return self._queue.ahead(waiting)

    @property
    def draining(self) -> bool:
        return self._gate.draining

    @property
    def in_flight(self) -> int:
        """Requests queued or holding a lease."""
        return len(self._queue) + self._gate.leased

    def reconfigure(self, limits: Limits, max_queue: int) -> None:
        """New limits from a reloaded configuration, applied at once; no runner is stopped for them."""
        self._limits = limits
        self._queue.limit = max_queue
        self._pump()

    def fits(self, memory: int, footprint: Footprint | None = None) -> bool:
        """Whether a runner of C{memory} bytes fits now beside every other, without stopping one.

        With GPUs, C{footprint} is placed as the plan would place it in what each has free.
        """
        return self.roster.fits(memory, attrs.evolve(self._limits, gpus=self.gpus), footprint)

    def admit(self) -> None:
        """Raise L{Unavailable} when this loader takes no new requests: closed, or draining."""
        self._gate.admit()

    def acquire(self, request: LoadRequest, rank: int = priority.NORMAL) -> Deferred[Lease]:
        """A lease on a ready runner for C{request.key}; cancel it to leave the queue.

        C{rank}: the request's priority class, which orders the queue (L{priority}).
        """
        try:
            self.admit()
        except Unavailable as e:
            return fail(e)
        paused = self._backoff.left(request.key)
        if paused:
            return fail(
                Unavailable(
                    f"model {request.model.name} failed to load recently; retrying is paused, try again soon",
                    code="load_backoff",
                    retry_after=paused,
                )
            )
        running = [r for r in map(self.runners.get, instances(request)) if r is not None]
        runner = (self.prefer(request, running) if len(running) > 1 else None) or least_busy(running)
        room = runner is not None and runner.has_room
        if (
            self._queue.full
            and not room
            and not self._queue.make_way(rank, self._clock.seconds(), self.starvation)
        ):
            return fail(refusals.queue_full(self._queue.limit, "try again shortly"))
        if not self._queue and runner is not None and room:
            return succeed(self._lease(runner, request))  # the common case: no one to plan for
        waiter = Waiter(request, Deferred(lambda d: self._leave(waiter)), rank, self._clock.seconds())
        self._queue.append(waiter)
        if len(running) < request.instances or room:
            # A waiter for runners that all exist but have no free slot changes no decision:
            # the plan passes over it until one of them frees a slot (see _release).
            self._pump()
        return waiter.deferred

    def unload(self, match: Callable[[RunnerKey], bool]) -> Deferred[Any]:
        """Stop idle runners that C{match}; drain busy ones. Fires when the idle ones have exited.

        A draining runner can serve a long stream for minutes: the caller is
        not kept waiting for it.
        """
        ended = []
        for runner in [r for r in self.runners.values() if match(r.key)]:
            if self.runners.get(runner.key) is not runner:
                continue  # stopped meanwhile, by a plan the end of another runner made
            if runner.in_use:
                if runner.state is State.READY:
                    self._retire(runner, "unload", drain=True)
            else:
                ended.append(runner.when_ended())
                self._retire(runner, "unload")
        self._pump()
        return DeferredList(ended)

    def keep_alive(self, match: Callable[[RunnerKey], bool], seconds: float) -> None:
        """Give the runners that C{match} a new keep-alive, counted from now if they are idle."""
        for runner in [r for r in self.runners.values() if match(r.key)]:
            runner.retime(keep_alive=seconds)

    def pin(self, match: Callable[[RunnerKey], bool], pinned: bool) -> None:
        """Pin the runners that C{match} (no expiry, no eviction), or let them go again."""
        for runner in [r for r in self.runners.values() if match(r.key)]:
            runner.retime(pinned=pinned)

    def drain(self) -> Deferred[None]:
        """Refuse new requests from now on; fire once none waits and no lease is held.

        The requests already queued are still served: a client whose request was
        accepted gets its answer. Runners stay loaded until L{close}.
        """
        return self._gate.drain(len(self._queue))

    def _settle(self) -> None:
        self._gate.settle(len(self._queue))

    def close(self) -> Deferred[None]:
        """Refuse new work, fail the queue, stop every runner; fire when all have exited."""
        self._gate.closed = True
        self.pacing.stop()
        self._queue.close()
        for runner in list(self.runners.values()):
            if self.runners.get(runner.key) is runner:
                runner.stop()
        return self.roster.when_empty()

    # What the runners' machines tell the loader (L{roster.Keeper})

    def opened(self, runner: Runner) -> None:
        self._backoff.clear(runner.key, first(runner.key))
        self.pacing.loaded(runner)

    def failed(self, runner: Runner, reason: Failure) -> None:
        key = first(runner.key)
        if runner.key != key and key in self.runners:
            # The first instance serves its model's requests; this one is not tried again for a while.
            self._backoff.hold(runner.key)
            error = reason.getErrorMessage()
            self.log.warn("instance {key} failed to load: {error}", key=runner.key, error=error)
            return
        device = runner.process.load_report.out_of_memory
        if device is not None:
            if smaller.retry_waiters(runner, device, self._estimate, self._queue):
                return
            reason = Failure(smaller.out_of_memory(runner, device, reason.getErrorMessage()))
        delay = self._backoff.hold(key)
        self.log.warn(
            "runner {key} failed to load ({error}); backing off {delay}s",
            key=key,
            error=reason.getErrorMessage(),
            delay=delay,
        )
        self._fail_waiters(key, reason)  # before its machine stops it: that must not start a load for them

    def replan(self) -> None:
        if not self._gate.closed:
            self._pump()

    # Leases

    def _leave(self, waiter: Waiter) -> None:
        self._queue.remove(waiter)
        self._pump()
        self._settle()

    def _lease(self, runner: Runner, request: LoadRequest) -> Lease:
        runner.lease(request.keep_alive if request.sets_keep_alive else None)
        self._gate.leased += 1
        return Lease(runner, self._release)

    def _release(self, runner: Runner) -> None:
        runner.release()
        self._gate.leased -= 1
        self._hand_on(runner)
        self._settle()

    def _hand_on(self, runner: Runner) -> None:
        """The slot C{runner} just freed goes to the head of the queue, or the plan decides."""
        if runner.state is not State.READY:
            self._pump()
            return
        if not self._queue:
            runner.rest()  # with no one waiting, the plan would decide nothing
            return
        head = priority.first(self._queue, self._clock.seconds(), self.starvation)
        key = first(runner.key)
        waiting = (waiter.key for waiter in self._queue)
        if head is not None and head.key == key and self.pacing.rules.order.hands_on(waiting, key):
            # The head takes this slot without a plan, as the order says the plan would give it.
            self._queue.remove(head)
            head.deferred.callback(self._lease(runner, head.request))
        else:
            self._pump()

    # Plans

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
                limits = attrs.evolve(self._limits, gpus=self.gpus)
                stopping = self.roster.stopping()
                plan = self.pacing.plan(
                    self._clock, self._queue, self.runners, stopping, limits, self._instances
                )
                self._act(plan)
        finally:
            self._pumping = False

    def _budgets(self, gpus: tuple[tuple[str, int], ...]) -> None:
        """The devices were listed again: plan with their budgets from now on."""
        self.gpus = gpus
        self.replan()

    def _instances(self, waiter: Waiter) -> list[RunnerKey]:
        """The runners that may serve C{waiter}, less other instances whose load failed just now."""
        return [key for key in instances(waiter.request) if key == waiter.key or not self._backoff.left(key)]

    def _act(self, decision: policy.Plan[Waiter, RunnerKey]) -> None:
        for waiter, key in zip(decision.assign, decision.assign_to, strict=True):
            runner = self.runners.get(key)
            if waiter in self._queue and runner is not None and runner.in_use < runner.parallel:
                self._queue.remove(waiter)
                waiter.deferred.callback(self._lease(runner, waiter.request))
        for key in decision.evict:
            victim = self.runners.get(key)
            if victim is not None and victim.in_use == 0:
                self.log.info("evicting idle runner {key} to make room", key=key)
                self._retire(victim, "memory")
        for key in decision.drain:
            runner = self.runners.get(key)
            if runner is not None and runner.state is State.READY:
                self.log.info("draining busy runner {key} to make room", key=key)
                self._retire(runner, "memory", drain=True)
        placements: tuple[Placement | None, ...] = decision.placements or (None,) * len(decision.load)
        for waiter, placement, key in zip(decision.load, placements, decision.load_as, strict=True):
            if key not in self.runners:
                self._load(attrs.evolve(waiter.request, key=key), placement)
        for key in policy.drained(self.runners):
            self.runners[key].stop()
        for runner in list(self.runners.values()):
            runner.rest()

    def _retire(self, runner: Runner, reason: str, drain: bool = False) -> None:
        """Tell the events why C{runner} goes, then stop it, or drain it when it still serves."""
        self._events.evicted(runner.key, runner.model_name, reason)
        if drain:
            runner.drain()
        else:
            runner.stop()

    # Loads

    def _load(self, request: LoadRequest, placement: Placement | None = None) -> None:
        self.log.info("loading {model} for {key}", model=request.model.name, key=request.key)
        settings = attrs.evolve(request.settings, placement=placement)
        try:
            self.roster.add(request, self._spawn(request.key, request.model, settings), placement)
        except MrunnerError as e:
            self._events.load_failed(request.key, request.model.name)
            self._fail_waiters(request.key, Failure(e))  # e.g. a model the backend cannot serve
            return
        except Exception as e:
            self._events.load_failed(request.key, request.model.name)
            error = RunnerFailed(f"mrunner could not start a runner for {request.model.name}: {e}")
            self._fail_waiters(request.key, Failure(error))

    def _fail_waiters(self, key: RunnerKey, reason: Failure) -> None:
        self._queue.fail(key, reason)
        self._settle()

    @property
    def _events(self) -> ILoaderEvents:
        return self.roster.events
