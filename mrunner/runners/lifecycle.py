"""A runner's life as one machine: every stage, input, output and timer in one table.

::

    NEW ─start─> LOADING ─answer─> READY ─drain─> DRAINING
                  │  │              │  │             │
                  │  └─time_out,────┼──┼──> FAILING  │
                  │    fail         │  └─expire──┐   │
                  └─stop────────────┴─stop───────┴───┴─stop─> STOPPING
    FAILING, STOPPING ─end─> ENDED  (grace_over: kill, in the same stage)

Readiness is LOADING's business: C{start} spawns the process, arms the load
deadline and probes C{/health} at once; a "not yet" arms the poll timer
(each wait half again as long as the last, up to a cap), output from the
runner brings it forward, and C{answer} or the deadline ends it. Stopping is
SIGTERM with the stop grace armed; its end is SIGKILL. The keep-alive runs
only while the runner is ready and idle: the loader's C{rest} arms it, a
lease, a drain or a stop cancels it, and its firing is C{expire}. A process
can end in any stage (it crashed, or was killed): C{end} is allowed from
every stage but NEW and ENDED, and how its end is told (failed, crashed or
stopped) is the move that ends it. An input the table does not have raises
L{IllegalMove} and changes nothing. The outputs are the runner's own side
effects, run in the order listed, after the stage has changed (an output
may cause another input at once: stopping a process that has already gone
ends it, and a keep-alive of 0 expires as soon as it is armed), each by the
method of the same name on the machine's core, the runner
(L{mrunner.runners.runner.Runner}; L{Effects} lists them). Only C{spawn} may
raise (the process could not start): that runner is then never kept.

Why a table and not automat's C{TypeMachineBuilder}, which Twisted's
C{ClientService} uses: the policy, the snapshots and C{/engines/ps} read the
state as a L{State} value, and automat keeps its current state private, so
a second record of it would be back; the table is data, so a test walks
every (stage, input) pair, legal and not; and it costs less on the request
path, where every request is a C{lease} and a C{release} (about 3 µs
against 11 µs a pair, measured with C{timeit} on the shared dev machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Protocol

import attrs

from mrunner.moves import IllegalMove
from mrunner.values import State

__all__ = ["MACHINE", "Effects", "IllegalMove", "Input", "Move", "Output", "Stage", "step"]


class Stage(Enum):
    """Where a runner is in its life; C{state} is the L{State} the snapshots and the policy read."""

    NEW = "new"  # made, not started
    LOADING = "loading"  # its process runs; its health is polled until its load deadline
    READY = "ready"
    DRAINING = "draining"  # finishes what it serves, takes nothing new
    FAILING = "failing"  # its start failed; its process is being stopped
    STOPPING = "stopping"  # asked to stop; its process is being stopped
    ENDED = "ended"  # its process is gone

    @property
    def state(self) -> State:
        return _STATES.get(self) or State(self.value)


_STATES = {Stage.NEW: State.LOADING, Stage.FAILING: State.STOPPING}


class Input(Enum):
    """What can happen to a runner: from the loader, its process, or its own timers."""

    START = "start"  # the loader: spawn it
    POLL = "poll"  # its poll timer: probe its health
    UNHEALTHY = "unhealthy"  # its health check said not yet
    SPOKE = "spoke"  # it wrote while loading: it may just have become ready
    ANSWER = "answer"  # its health check said 200
    TIME_OUT = "time_out"  # its load deadline passed
    FAIL = "fail"  # its health check failed (a fake's start, refused)
    LEASE = "lease"  # the loader: a request takes one of its slots (and may bring a keep-alive)
    RELEASE = "release"  # the loader: a request gives its slot back (also after the runner has gone)
    REST = "rest"  # the loader has nothing for it: its keep-alive may start
    RETIME = "retime"  # the loader: a new keep-alive or pin, counted from now
    EXPIRE = "expire"  # its keep-alive timer ran out (or its keep-alive is 0)
    DRAIN = "drain"  # the loader: finish what it serves, take nothing new
    STOP = "stop"  # the loader: go (room for another, unload, shutdown)
    GRACE_OVER = "grace_over"  # its stop grace passed and the process is still there
    END = "end"  # its process is gone


class Output(Enum):
    """What a runner does on a move; each is a method of L{Effects}."""

    SPAWN = "spawn"  # start the process (raises when it cannot: the runner is then never kept)
    ARM_DEADLINE = "arm_deadline"  # its load timeout starts
    PROBE = "probe"  # GET /health
    POLL_LATER = "poll_later"  # the poll timer, each wait half again as long as the last, up to a cap
    POLL_SOON = "poll_soon"  # the poll timer brought forward
    CANCEL_LOAD_TIMERS = "cancel_load_timers"  # the deadline, the poll timer, a probe's late answer
    OPENED = "opened"  # ready: its socket private, note the time, tell the events, measure its memory
    TAKE_SLOT = "take_slot"
    GIVE_SLOT = "give_slot"  # the last one out notes the time and may measure
    TAKE_TERMS = "take_terms"  # the keep-alive or pin its input brought
    ARM_EXPIRY = "arm_expiry"  # idle, unpinned, not forever: its keep-alive timer starts (0: expire now)
    CANCEL_EXPIRY = "cancel_expiry"  # its keep-alive timer runs only while it is ready and idle
    EXPIRED = "expired"  # told as an idle eviction
    LEAVE = "leave"  # out of the loader's runners by key: no new request finds it
    REPORT_FAILURE = "report_failure"  # count it, back off, fail its waiters (before it is stopped)
    STOP_PROCESS = "stop_process"  # its stop grace starts, and SIGTERM
    KILL = "kill"  # SIGKILL
    CANCEL_GRACE = "cancel_grace"
    CRASHED = "crashed"  # it went while serving: logged
    EVICTED_CRASH = "evicted_crash"  # counted as an eviction (a draining one was counted when it began)
    EXITED_FAILED = "exited_failed"  # the events hear how it ended
    EXITED_CRASHED = "exited_crashed"
    EXITED_STOPPED = "exited_stopped"
    GONE = "gone"  # out of the records
    REPLAN = "replan"  # the loader plans again: a slot, memory or a waiter's answer may have changed


class Effects(Protocol):
    """The machine's core: its stage, and one method per L{Output}."""

    stage: Stage

    def spawn(self) -> None: ...
    def arm_deadline(self) -> None: ...
    def probe(self) -> None: ...
    def poll_later(self) -> None: ...
    def poll_soon(self) -> None: ...
    def cancel_load_timers(self) -> None: ...
    def opened(self) -> None: ...
    def take_slot(self) -> None: ...
    def give_slot(self) -> None: ...
    def take_terms(self) -> None: ...
    def arm_expiry(self) -> None: ...
    def cancel_expiry(self) -> None: ...
    def expired(self) -> None: ...
    def leave(self) -> None: ...
    def report_failure(self) -> None: ...
    def stop_process(self) -> None: ...
    def kill(self) -> None: ...
    def cancel_grace(self) -> None: ...
    def crashed(self) -> None: ...
    def evicted_crash(self) -> None: ...
    def exited_failed(self) -> None: ...
    def exited_crashed(self) -> None: ...
    def exited_stopped(self) -> None: ...
    def gone(self) -> None: ...
    def replan(self) -> None: ...


@attrs.frozen
class Move:
    to: Stage
    outputs: tuple[Output, ...] = ()


N, L, R, D = Stage.NEW, Stage.LOADING, Stage.READY, Stage.DRAINING
F, S, E = Stage.FAILING, Stage.STOPPING, Stage.ENDED
In, Out = Input, Output
_STOP = (Out.LEAVE, Out.STOP_PROCESS)
_FAIL = (Out.CANCEL_LOAD_TIMERS, Out.REPORT_FAILURE, *_STOP, Out.REPLAN)
_GONE = (Out.GONE, Out.REPLAN)

#: Every move a runner can make. Outputs run in this order.
MACHINE: Mapping[tuple[Stage, Input], Move] = {
    (N, In.START): Move(L, (Out.SPAWN, Out.ARM_DEADLINE, Out.PROBE)),
    (L, In.POLL): Move(L, (Out.PROBE,)),
    (L, In.UNHEALTHY): Move(L, (Out.POLL_LATER,)),
    (L, In.SPOKE): Move(L, (Out.POLL_SOON,)),
    (L, In.ANSWER): Move(R, (Out.CANCEL_LOAD_TIMERS, Out.OPENED, Out.REPLAN)),
    (L, In.TIME_OUT): Move(F, _FAIL),
    (L, In.FAIL): Move(F, _FAIL),
    (L, In.REST): Move(L),
    (L, In.RETIME): Move(L, (Out.TAKE_TERMS,)),
    (L, In.STOP): Move(S, (Out.CANCEL_LOAD_TIMERS, *_STOP)),
    (L, In.END): Move(E, (Out.CANCEL_LOAD_TIMERS, Out.REPORT_FAILURE, Out.LEAVE, Out.EXITED_FAILED, *_GONE)),
    (R, In.LEASE): Move(R, (Out.TAKE_SLOT, Out.TAKE_TERMS, Out.CANCEL_EXPIRY)),
    (R, In.RELEASE): Move(R, (Out.GIVE_SLOT,)),
    (R, In.REST): Move(R, (Out.ARM_EXPIRY,)),
    (R, In.RETIME): Move(R, (Out.TAKE_TERMS, Out.CANCEL_EXPIRY, Out.ARM_EXPIRY)),
    (R, In.EXPIRE): Move(S, (Out.EXPIRED, Out.CANCEL_EXPIRY, *_STOP, Out.REPLAN)),
    (R, In.DRAIN): Move(D, (Out.CANCEL_EXPIRY,)),
    (R, In.STOP): Move(S, (Out.CANCEL_EXPIRY, *_STOP)),
    (R, In.END): Move(
        E, (Out.CANCEL_EXPIRY, Out.LEAVE, Out.CRASHED, Out.EVICTED_CRASH, Out.EXITED_CRASHED, *_GONE)
    ),
    (D, In.RELEASE): Move(D, (Out.GIVE_SLOT,)),
    (D, In.REST): Move(D),
    (D, In.RETIME): Move(D, (Out.TAKE_TERMS,)),
    (D, In.STOP): Move(S, _STOP),
    (D, In.END): Move(E, (Out.LEAVE, Out.CRASHED, Out.EXITED_CRASHED, *_GONE)),
    (F, In.GRACE_OVER): Move(F, (Out.KILL,)),
    (F, In.END): Move(E, (Out.CANCEL_GRACE, Out.EXITED_FAILED, *_GONE)),
    (S, In.RELEASE): Move(S, (Out.GIVE_SLOT,)),
    (S, In.GRACE_OVER): Move(S, (Out.KILL,)),
    (S, In.END): Move(E, (Out.CANCEL_GRACE, Out.EXITED_STOPPED, *_GONE)),
    (E, In.RELEASE): Move(E, (Out.GIVE_SLOT,)),
}
del N, L, R, D, F, S, E, In, Out, _STOP, _FAIL, _GONE  # the table's shorthand only


def step(core: Effects, input: Input) -> None:
    """Move C{core} by C{input}: its new stage first, then each output of the move, in order.

    @raise IllegalMove: C{input} has no move from C{core}'s stage; nothing changes.
    """
    move = MACHINE.get((core.stage, input))
    if move is None:
        raise IllegalMove(f"a runner cannot {input.value} when {core.stage.value}")
    core.stage = move.to
    for output in move.outputs:
        getattr(core, output.value)()
