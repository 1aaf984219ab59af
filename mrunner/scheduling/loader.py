"""Keeps runners: loads them on demand, shares them, queues requests, evicts idle ones.

All state lives on the reactor: the queue and the back-offs here, each
runner's in its record (L{roster.Runner}), which only its machine
(L{lifecycle}) changes. What to do next is decided by L{policy.plan}, so the
rules are tested without processes; the loader applies the plans and tells
each runner's machine what happened to it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, DeferredList, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mrunner.errors import MrunnerError, RunnerFailed, Unavailable
from mrunner.interfaces import IDevices, ILease, ILoaderEvents, IRunnerProcess
from mrunner.scheduling import policy, priority
from mrunner.scheduling.policy import Limits
from mrunner.scheduling.roster import LoadRequest, Roster, Runner, unmeasured
from mrunner.values import HOST, Footprint, Placement, RunnerKey, State
from mrunner.values.backend import RunnerSettings
from mrunner.values.model import Model

SHUTTING_DOWN = "mrunner is shutting down; try again once it has restarted"
DRAINING = (
    "this mrunner node is draining: it finishes the requests it has and takes no new ones;"
    " send this request to another node, or try again once this one has restarted"
)


Spawn = Callable[[RunnerKey, Model, RunnerSettings], IRunnerProcess]
#: A request with its memory and footprint estimated again for its settings (by its backend).
Estimate = Callable[[LoadRequest], LoadRequest]


def same_estimate(request: LoadRequest) -> LoadRequest:
    """A loader without backends keeps the estimate it was given."""
    return request


@attrs.define(eq=False)
class _Waiter:
    request: LoadRequest
    deferred: Deferred[Lease]
    #: Its class (L{priority}: 0 is served first) and when it came, for the queue's order.
    priority: int = priority.NORMAL
    since: float = 0.0

    @property
    def key(self) -> RunnerKey:
        return self.request.key

    @property
    def memory(self) -> int:
        return self.request.memory

    @property
    def footprint(self) -> Footprint:
        return self.request.footprint or Footprint(self.request.memory)


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
        devices: IDevices | None = None,
        starvation: float = 60.0,
        estimate: Estimate = same_estimate,
    ):
        self._clock = clock
        self._estimate = estimate
        self._devices = devices
        self._gpus: tuple[tuple[str, int], ...] | None = None
        #: Seconds of waiting after which a waiter moves up a priority class (L{priority}).
        self.starvation = starvation
        self._spawn = spawn
        self._limits = limits
        self._max_queue = max_queue
        self.roster = Roster(clock, events or NoEvents(), self, devices.used_by if devices else unmeasured)
        #: The runner each key's requests go to (the roster's; stopping ones are not in it).
        self.runners = self.roster.by_key
        self._queue: deque[_Waiter] = deque()
        self._backoff: dict[RunnerKey, _Backoff] = {}
        self._closed = False
        #: Fired once a drain is done: nothing queued, no lease held (L{drain}).
        self._drained: list[Deferred[None]] = []
        self.draining = False
        self._leased = 0
        self._pumping = False
        self._repump = False

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Requests queued or holding a lease."""
        return len(self._queue) + self._leased

    def reconfigure(self, limits: Limits, max_queue: int) -> None:
        """New limits from a reloaded configuration, applied at once; no runner is stopped for them."""
        self._limits = limits
        self._max_queue = max_queue
        self._pump()

    def fits(self, memory: int, footprint: Footprint | None = None) -> bool:
        """Whether a runner of C{memory} bytes fits now beside every other, without stopping one.

        With GPUs, C{footprint} is placed as the plan would place it in what each has free.
        """
        gpus = self.gpus()
        if not gpus or footprint is None:
            return self.roster.fits(memory, self._limits)
        held = self.roster.on_gpus()
        free = {device: budget - held.get(device, 0) for device, budget in gpus}
        placement = policy.place(footprint, free, list(free))
        in_room = all(size <= free[device] for device, size in placement.on_gpus.items())
        return in_room and self.roster.fits(placement.in_ram, self._limits)

    def admit(self) -> None:
        """Raise L{Unavailable} when this loader takes no new requests: closed, or draining."""
        if self._closed:
            raise Unavailable(SHUTTING_DOWN, code="shutting_down")
        if self.draining:
            raise Unavailable(DRAINING, code="draining", retry_after=1.0)

    def acquire(self, request: LoadRequest, rank: int = priority.NORMAL) -> Deferred[Lease]:
        """A lease on a ready runner for C{request.key}; cancel it to leave the queue.

        C{rank}: the request's priority class, which orders the queue (L{priority}).
        """
        try:
            self.admit()
        except Unavailable as e:
            return fail(e)
        backoff = self._backoff.get(request.key)
        if backoff is not None and self._clock.seconds() < backoff.until:
            return fail(
                Unavailable(
                    f"model {request.model.name} failed to load recently; retrying is paused, try again soon",
                    code="load_backoff",
                    retry_after=backoff.until - self._clock.seconds(),
                )
            )
        running = [r for r in map(self.runners.get, _instances(request)) if r is not None]
        runner = _least_busy(running)
        room = runner is not None and runner.has_room
        if len(self._queue) >= self._max_queue and not room and not self._make_way(rank):
            return fail(self._full("try again shortly"))
        if not self._queue and runner is not None and room:
            return succeed(self._lease(runner, request))  # the common case: no one to plan for
        waiter = _Waiter(request, Deferred(lambda d: self._leave(waiter)), rank, self._clock.seconds())
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
                ended.append(_when_ended(runner))
                self._retire(runner, "unload")
        self._pump()
        return DeferredList(ended)

    def keep_alive(self, match: Callable[[RunnerKey], bool], seconds: float) -> None:
        """Give the runners that C{match} a new keep-alive, counted from now if they are idle."""
        self._retime(match, seconds=seconds)

    def pin(self, match: Callable[[RunnerKey], bool], pinned: bool) -> None:
        """Pin the runners that C{match} (no expiry, no eviction), or let them go again."""
        self._retime(match, pinned=pinned)

    def _retime(self, match: Callable[[RunnerKey], bool], **changes: Any) -> None:
        """Change what decides the expiry of the runners that C{match}, and restart their clocks."""
        for runner in list(self.runners.values()):
            if match(runner.key):
                for name, value in changes.items():
                    setattr(runner.expiry, name, value)
                runner.expiry.cancel()
                self._rest(runner)

    def drain(self) -> Deferred[None]:
        """Refuse new requests from now on; fire once none waits and no lease is held.

        The requests already queued are still served: a client whose request was
        accepted gets its answer. Runners stay loaded until L{close}.
        """
        self.draining = True
        done: Deferred[None] = Deferred()
        self._drained.append(done)
        self._settle()
        return done

    def _settle(self) -> None:
        """Fire the drain's Deferreds once nothing waits and nothing is served."""
        if self._drained and not self._queue and not self._leased:
            done, self._drained = self._drained, []
            for d in done:
                d.callback(None)

    def close(self) -> Deferred[None]:
        """Refuse new work, fail the queue, stop every runner; fire when all have exited."""
        self._closed = True
        while self._queue:
            self._queue.popleft().deferred.errback(Unavailable(SHUTTING_DOWN, code="shutting_down"))
        for runner in list(self.runners.values()):
            if self.runners.get(runner.key) is runner:
                runner.stop()
        return self.roster.when_empty()

    # What the runners' machines tell the loader (L{roster.Keeper})

    def opened(self, runner: Runner) -> None:
        self._backoff.pop(runner.key, None)
        self._backoff.pop(_first(runner.key), None)

    def failed(self, runner: Runner, reason: Failure) -> None:
        key = _first(runner.key)
        if runner.key != key and key in self.runners:
            # The first instance serves its model's requests; this one is not tried again for a while.
            previous = self._backoff.get(runner.key)
            delay = policy.next_backoff(previous.delay if previous else None)
            self._backoff[runner.key] = _Backoff(delay, self._clock.seconds() + delay)
            error = reason.getErrorMessage()
            self.log.warn("instance {key} failed to load: {error}", key=runner.key, error=error)
            return
        device = runner.process.load_report.out_of_memory
        if device is not None:
            if self._retry_smaller(runner, device):
                return
            reason = Failure(out_of_memory(runner, device, reason.getErrorMessage()))
        previous = self._backoff.get(key)
        delay = policy.next_backoff(previous.delay if previous else None)
        self._backoff[key] = _Backoff(delay, self._clock.seconds() + delay)
        self.log.warn(
            "runner {key} failed to load ({error}); backing off {delay}s",
            key=key,
            error=reason.getErrorMessage(),
            delay=delay,
        )
        self._fail_waiters(key, reason)  # before its machine stops it: that must not start a load for them

    def _retry_smaller(self, runner: Runner, device: str) -> bool:
        """Plan again for C{runner}'s waiters with the next smaller plan (L{policy.smaller}), if any."""
        request, footprint = runner.request, runner.request.footprint
        if footprint is None:
            return False
        smaller = policy.smaller(footprint, runner.gpu_layers, None if request.halved else request.context)
        if smaller is None:
            return False
        if smaller.context is not None:
            request = self._smaller_context(runner, smaller.context)
        if smaller.offload is not None and request.footprint is not None:
            request = attrs.evolve(
                request, footprint=attrs.evolve(request.footprint, offload=smaller.offload)
            )
        self.log.warn(
            "runner {key} ran out of memory on {device} with {layers} layers offloaded; trying once more"
            " with {fewer} layers and a context of {context} tokens",
            key=runner.key,
            device=device,
            layers=runner.gpu_layers,
            fewer=runner.gpu_layers if smaller.offload is None else smaller.offload,
            context=request.settings.context_size or "the model's",
        )
        for waiter in self._queue:
            if waiter.key == _first(runner.key):
                waiter.request = request
        return True

    def _smaller_context(self, runner: Runner, context: int) -> LoadRequest:
        """C{runner}'s request with a context of C{context} tokens, estimated again, and no more
        layers on the GPUs than it had (a smaller context is not a reason to offload more)."""
        request = runner.request
        smaller = self._estimate(
            attrs.evolve(request, settings=attrs.evolve(request.settings, context_size=context))
        )
        if smaller.footprint is None:
            return smaller
        return attrs.evolve(smaller, footprint=attrs.evolve(smaller.footprint, offload=runner.gpu_layers))

    def replan(self) -> None:
        if not self._closed:
            self._pump()

    # Leases

    def _leave(self, waiter: _Waiter) -> None:
        self._queue.remove(waiter)
        self._pump()
        self._settle()

    def _full(self, advice: str) -> Unavailable:
        return Unavailable(
            f"too many requests waiting ({self._max_queue}); {advice}", code="queue_full", retry_after=1.0
        )

    def _make_way(self, rank: int) -> bool:
        """Turn away the waiter a request of class C{rank} may take the place of in the full queue
        (L{priority.displaced}); False when there is none."""
        waiter = priority.displaced(self._queue, rank, self._clock.seconds(), self.starvation)
        if waiter is None:
            return False
        self._queue.remove(waiter)
        waiter.deferred.errback(self._full("a request of a higher priority class took this place; try again"))
        return True

    def _lease(self, runner: Runner, request: LoadRequest) -> Lease:
        runner.lease()
        self._leased += 1
        if request.sets_keep_alive:
            runner.expiry.seconds = request.keep_alive
        return Lease(runner, self._release)

    def _release(self, runner: Runner) -> None:
        runner.release()
        self._leased -= 1
        self._hand_on(runner)
        self._settle()

    def _hand_on(self, runner: Runner) -> None:
        """The slot C{runner} just freed goes to the head of the queue, or the plan decides."""
        if runner.state is not State.READY:
            self._pump()
            return
        if not self._queue:
            self._rest(runner)  # with no one waiting, the plan would decide nothing
            return
        head = priority.first(self._queue, self._clock.seconds(), self.starvation)
        if head is not None and head.key == _first(runner.key):
            # The plan serves the queue in order and free slots first: the head takes this slot.
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
                stopping = self.roster.stopping()
                limits = attrs.evolve(self._limits, gpus=self.gpus(fresh=bool(self._queue)))
                on_gpus = Counter[str]()
                for runner in stopping:
                    on_gpus.update(runner.on_gpus)
                memory = [runner.memory for runner in stopping]
                ordered = priority.order(self._queue, self._clock.seconds(), self.starvation)
                decision = policy.plan(ordered, self.runners, memory, limits, dict(on_gpus), self._instances)
                self._act(decision)
        finally:
            self._pumping = False

    def gpus(self, fresh: bool = True) -> tuple[tuple[str, int], ...]:
        """Each GPU's budget; none on a machine without GPUs.

        Asking the devices costs a snapshot of every runner, so a caller that
        will not load (a request for a runner that is there, a plan with no one
        waiting) takes the answer of the last caller that asked afresh.
        """
        if self._devices is None:
            return ()
        if fresh or self._gpus is None:
            self._gpus = tuple((d.id, d.budget) for d in self._devices.devices() if d.id != HOST)
        return self._gpus

    def _instances(self, waiter: _Waiter) -> list[RunnerKey]:
        """The runners that may serve C{waiter}, less other instances whose load failed just now."""
        now = self._clock.seconds()
        return [
            key
            for key in _instances(waiter.request)
            if key == waiter.key or key not in self._backoff or self._backoff[key].until <= now
        ]

    def _act(self, decision: policy.Plan[_Waiter, RunnerKey]) -> None:
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
            self._rest(runner)

    def _retire(self, runner: Runner, reason: str, drain: bool = False) -> None:
        """Tell the events why C{runner} goes, then stop it, or drain it when it still serves."""
        self._events.evicted(runner.key, runner.model_name, reason)
        if drain:
            runner.drain()
        else:
            runner.stop()

    def _rest(self, runner: Runner) -> None:
        """Start C{runner}'s keep-alive clock if it is ready and idle; keep-alive 0 stops it now."""
        if runner.state is State.READY and not runner.in_use:
            runner.expiry.rest(now=lambda: self._retire(runner, "idle"), later=lambda: self._expire(runner))

    def _expire(self, runner: Runner) -> None:
        self.log.info("runner {key} idle for its keep-alive; stopping", key=runner.key)
        self._retire(runner, "idle")
        self._pump()

    # Loads

    def _load(self, request: LoadRequest, placement: Placement | None = None) -> None:
        self.log.info("loading {model} for {key}", model=request.model.name, key=request.key)
        settings = attrs.evolve(request.settings, placement=placement)
        try:
            process = self._spawn(request.key, request.model, settings)
        except MrunnerError as e:
            self._events.load_failed(request.key, request.model.name)
            self._fail_waiters(request.key, Failure(e))  # e.g. a model the backend cannot serve
            return
        except Exception as e:
            self._events.load_failed(request.key, request.model.name)
            error = RunnerFailed(f"mrunner could not start a runner for {request.model.name}: {e}")
            self._fail_waiters(request.key, Failure(error))
            return
        self.roster.add(request, process, placement)

    def _fail_waiters(self, key: RunnerKey, reason: Failure) -> None:
        for waiter in [w for w in self._queue if w.key == key]:
            self._queue.remove(waiter)
            waiter.deferred.errback(reason)
        self._settle()

    @property
    def _events(self) -> ILoaderEvents:
        return self.roster.events


def _instances(request: LoadRequest) -> list[RunnerKey]:
    """The keys of the runners that may serve C{request}: one per instance of its model."""
    return [attrs.evolve(request.key, instance=n) for n in range(request.instances)]


def _first(key: RunnerKey) -> RunnerKey:
    """The key of the first instance of C{key}'s model, which its waiters and back-off go by."""
    return attrs.evolve(key, instance=0) if key.instance else key


def _least_busy(runners: list[Runner]) -> Runner | None:
    """The runner with the most free slots (the first of equals), ready ones before the others."""
    return max(runners, key=lambda r: (r.has_room, r.parallel - r.in_use), default=None)


def out_of_memory(runner: Runner, device: str, output: str) -> RunnerFailed:
    """The error for a runner that ran out of C{device}'s memory while loading, even with fewer
    layers (and half the context, when no context size was set)."""
    request = runner.request
    halved = f" and its context halved to {request.settings.context_size} tokens" if request.halved else ""
    return RunnerFailed(
        f"model {runner.model_name} ran out of memory on {device} while loading, with"
        f" {runner.gpu_layers} layers offloaded{halved}; lower [gpu] memory_budget for {device}, or use a"
        f" smaller context size ({output})"
    )


def _when_ended(runner: Runner) -> Deferred[None]:
    d: Deferred[None] = Deferred()

    def ended(result: object) -> object:
        d.callback(None)
        return result

    runner.process.ended.addBoth(ended)
    return d
