"""How long a waiter lets a loaded model serve its own queue, and which idle runner costs least to lose.

Pure decisions, as L{mrunner.scheduling.policy}'s: the clock, the waiters'
arrival and the runners' load times are inputs. Under C{order = "loaded"}
(L{mrunner.scheduling.order.LOADED}) a runner that serves (a request in flight, or one queued for it)
is drained for another model's waiter only once that waiter is I{overdue}:
it has waited its patience, C{max_wait} for a normal request, half of it for
a high one, twice for a low one (its class as L{priority.effective} says, so
one promoted by C{starvation_seconds} counts as the better class). Even then a
runner just loaded keeps serving its own for C{min_serve} times its own load
time (at most C{max_wait}) once ready, so a load is not thrown away on one
batch. An idle runner nobody asks for goes at once (unless it finished just
now: L{grace}), cheapest to bring back first (L{eviction_order}).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Protocol, TypeVar

from mrunner.scheduling import priority
from mrunner.values import State

#: The longest an idle runner is kept for its clients' next requests (L{grace}).
RECENT = 1.0
#: Seconds to bring back a runner whose load was never measured, per byte it holds (a GiB a second).
UNMEASURED_SECONDS_PER_BYTE = 1 / 2**30


class RulesView(Protocol):
    """What patience reads of C{[scheduler]}'s rules (L{mrunner.scheduling.order.Rules})."""

    @property
    def max_wait(self) -> float: ...
    @property
    def min_serve(self) -> float: ...
    @property
    def starvation(self) -> float: ...


class Waiting(Protocol):
    @property
    def priority(self) -> int: ...
    @property
    def since(self) -> float: ...


class Serving(Protocol):
    @property
    def state(self) -> State: ...
    @property
    def in_use(self) -> int: ...
    @property
    def memory(self) -> int: ...
    @property
    def finished_at(self) -> float: ...
    @property
    def loaded_at(self) -> float:
        """When it became ready (0: not yet)."""

    @property
    def load_seconds(self) -> float:
        """How long its own load took (0: not measured)."""

    @property
    def served(self) -> int:
        """Requests it has taken since it loaded."""


K = TypeVar("K", bound=Hashable)


def patience(waiter: Waiting, now: float, rules: RulesView) -> float:
    """Seconds C{waiter} lets loaded models serve their own queues: C{max_wait}, halved for each
    class better than normal, doubled for each worse (its class now, starvation promotions in)."""
    rank = priority.effective(waiter, now, rules.starvation)
    return float(rules.max_wait * 2.0 ** (rank - priority.NORMAL))


def overdue(waiter: Waiting, now: float, rules: RulesView) -> bool:
    return now - waiter.since >= patience(waiter, now, rules)


def protected_until(runner: Serving, rules: RulesView) -> float:
    """Until when a runner just loaded keeps serving its own, overdue waiters or not."""
    return runner.loaded_at + min(rules.min_serve * runner.load_seconds, rules.max_wait)


def wake_at(
    waiters: Iterable[Waiting], runners: Iterable[Serving], now: float, rules: RulesView
) -> float | None:
    """The next time a plan may decide otherwise with nothing else changed: a waiter becomes
    overdue, a fresh runner's protection ends, an idle one's L{grace} ends; None when no time would."""
    times = [w.since + patience(w, now, rules) for w in waiters]
    ready = [r for r in runners if r.state is State.READY]
    times += [protected_until(r, rules) for r in ready]
    times += [r.finished_at + grace(r) for r in ready if not r.in_use]
    return min((t for t in times if t > now), default=None)


def grace(runner: Serving) -> float:
    """Seconds an idle runner is kept, once its last request is done, for its clients' next ones:
    half its load time, at most L{RECENT}. A busy client sends its next request as soon as it has
    its answer; that gap is no reason to swap its model out, and waiting half a load for it costs
    a waiter less than the load it saves, if it comes, would."""
    return min(RECENT, runner.load_seconds / 2)


def recent(runner: Serving, now: float) -> bool:
    """Whether C{runner} is idle only between one request of a busy client and its next."""
    return now - runner.finished_at < grace(runner)


def eviction_order(
    keys: Iterable[K], runners: Mapping[K, Serving], costs: Mapping[K, float], now: float
) -> list[K]:
    """C{keys} cheapest to bring back first: its load time here (C{costs}, else its own, else
    estimated from its size), times one plus its requests a minute, over one plus the minutes
    it has been idle. Equals go least recently finished first."""

    def value(key: K) -> tuple[float, float]:
        runner = runners[key]
        seconds = costs.get(key) or runner.load_seconds or runner.memory * UNMEASURED_SECONDS_PER_BYTE
        minutes_loaded = max(1.0, (now - runner.loaded_at) / 60) if runner.loaded_at else 1.0
        idle_minutes = max(0.0, now - runner.finished_at) / 60 if not runner.in_use else 0.0
        return seconds * (1 + runner.served / minutes_loaded) / (1 + idle_minutes), runner.finished_at

    return sorted(keys, key=value)
