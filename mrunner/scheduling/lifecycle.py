"""A runner's life as one machine: every state, input and output in one table.

::

    LOADING ──answer──> READY ──drain──> DRAINING
       │  └──fail──┐     │                 │
       └───stop────┴─────┴──────stop───────┴──> STOPPING ──end──> ENDED

A process can also end in any state (it crashed, or was killed): C{end} is
allowed from every state but ENDED. An input the table does not have raises
L{IllegalMove} and changes nothing. The outputs are the runner's own side
effects, run in the order listed, after the state has changed (an output
may cause another input at once: stopping a process that has already gone
ends it), each by the method of the same name on the machine's core, the
loader's record of the runner (L{mrunner.scheduling.roster.Runner};
L{Effects} lists them).

Why a table and not automat's C{TypeMachineBuilder}, which Twisted's
C{ClientService} uses: the policy, the snapshots and C{/engines/ps} read the
state as a L{State} value, and automat keeps its current state private, so
a second record of it would be back; the table is data, so a test walks
every (state, input) pair, legal and not; and it costs less on the request
path, where every request is a C{lease} and a C{release} (about 3 µs
against 11 µs a pair, measured with C{timeit} on the shared dev machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Protocol

import attrs

from mrunner.scheduling.moves import IllegalMove
from mrunner.values import State

__all__ = ["MACHINE", "Effects", "IllegalMove", "Input", "Move", "Output", "step"]


class Input(Enum):
    """What can happen to a runner."""

    ANSWER = "answer"  # its health check said 200
    FAIL = "fail"  # it could not start (its start failed, timed out, or it was stopped first)
    LEASE = "lease"  # a request takes one of its slots
    RELEASE = "release"  # a request gives its slot back (also after the runner has gone)
    DRAIN = "drain"  # finish what it serves, take nothing new
    STOP = "stop"  # told to go: idle, room for another, unload, shutdown
    END = "end"  # its process is gone


class Output(Enum):
    """What a runner does on a move; each is a method of L{Effects}."""

    OPENED = "opened"  # ready: note the time, tell the events, measure its memory
    TAKE_SLOT = "take_slot"
    GIVE_SLOT = "give_slot"  # the last one out notes the time and may measure
    CANCEL_EXPIRY = "cancel_expiry"  # its keep-alive clock runs only while it is ready and idle
    LEAVE = "leave"  # out of the loader's runners by key: no new request finds it
    ASKED_TO_STOP = "asked_to_stop"  # its end will be reported as C{stopped}
    REPORT_FAILURE = "report_failure"  # count it, back off, fail its waiters (before it is stopped)
    STOP_PROCESS = "stop_process"  # SIGTERM, SIGKILL after the grace period
    CRASHED = "crashed"  # it went while serving: logged
    EVICTED_CRASH = "evicted_crash"  # counted as an eviction (a draining one was counted when it began)
    EXITED = "exited"  # tell the events how it ended; out of the records
    REPLAN = "replan"  # the loader plans again: a slot, memory or a waiter's answer may have changed


class Effects(Protocol):
    """The machine's core: its state, and one method per L{Output}."""

    state: State

    def opened(self) -> None: ...
    def take_slot(self) -> None: ...
    def give_slot(self) -> None: ...
    def cancel_expiry(self) -> None: ...
    def leave(self) -> None: ...
    def asked_to_stop(self) -> None: ...
    def report_failure(self) -> None: ...
    def stop_process(self) -> None: ...
    def crashed(self) -> None: ...
    def evicted_crash(self) -> None: ...
    def exited(self) -> None: ...
    def replan(self) -> None: ...


@attrs.frozen
class Move:
    to: State
    outputs: tuple[Output, ...] = ()


L, R, D, S, E = State.LOADING, State.READY, State.DRAINING, State.STOPPING, State.ENDED
In, Out = Input, Output
_STOP = (Out.ASKED_TO_STOP, Out.CANCEL_EXPIRY, Out.LEAVE, Out.STOP_PROCESS)
_GONE = (Out.EXITED, Out.REPLAN)

#: Every move a runner can make. Outputs run in this order.
MACHINE: Mapping[tuple[State, Input], Move] = {
    (L, In.ANSWER): Move(R, (Out.OPENED, Out.REPLAN)),
    (L, In.FAIL): Move(S, (Out.REPORT_FAILURE, Out.LEAVE, Out.STOP_PROCESS, Out.REPLAN)),
    (L, In.STOP): Move(S, _STOP),
    (L, In.END): Move(E, (Out.LEAVE, *_GONE)),
    (R, In.LEASE): Move(R, (Out.TAKE_SLOT, Out.CANCEL_EXPIRY)),
    (R, In.RELEASE): Move(R, (Out.GIVE_SLOT,)),
    (R, In.DRAIN): Move(D, (Out.CANCEL_EXPIRY,)),
    (R, In.STOP): Move(S, _STOP),
    (R, In.END): Move(E, (Out.CANCEL_EXPIRY, Out.LEAVE, Out.CRASHED, Out.EVICTED_CRASH, *_GONE)),
    (D, In.RELEASE): Move(D, (Out.GIVE_SLOT,)),
    (D, In.STOP): Move(S, _STOP),
    (D, In.END): Move(E, (Out.LEAVE, Out.CRASHED, *_GONE)),
    # A start that fails while stopping is the stop itself: nothing to report.
    (S, In.FAIL): Move(S),
    (S, In.RELEASE): Move(S, (Out.GIVE_SLOT,)),
    (S, In.END): Move(E, _GONE),
    (E, In.RELEASE): Move(E, (Out.GIVE_SLOT,)),
}
del L, R, D, S, E, In, Out, _STOP, _GONE  # the table's shorthand only


def step(core: Effects, input: Input) -> None:
    """Move C{core} by C{input}: its new state first, then each output of the move, in order.

    @raise IllegalMove: C{input} has no move from C{core}'s state; nothing changes.
    """
    move = MACHINE.get((core.state, input))
    if move is None:
        raise IllegalMove(f"a runner cannot {input.value} when {core.state.value}")
    core.state = move.to
    for output in move.outputs:
        getattr(core, output.value)()
