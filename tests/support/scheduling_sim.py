"""A discrete-time run of L{policy.plan} against clients and runners with fixed load and request times.

No Twisted and no processes: a runner loads in its model's C{load} seconds,
a request takes its client's C{seconds}, stopping is instant, and each
client asks again C{think} seconds after its answer. The plan is applied as
the loader applies it (L{mrunner.scheduling.loader.Loader._act}), and asked
again whenever anything happens, and at the C{wake_at} it names. What it
records is what the tests and figures are about: each request's wait, the
loads, and whether a budget or a busy runner was ever broken.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import attrs

from mrunner.scheduling import policy
from mrunner.scheduling.order import Rules
from mrunner.scheduling.policy import Limits, State

MEMORY = 6
#: Holds one model of L{MEMORY} bytes, not two.
BUDGET = 10


@attrs.define
class Runner:
    state: State
    parallel: int
    memory: int = MEMORY
    in_use: int = 0
    finished_at: float = 0.0
    pinned: bool = False
    loaded_at: float = 0.0
    load_seconds: float = 0.0
    served: int = 0
    on_gpus: dict[str, int] = attrs.Factory(dict)


@attrs.define(eq=False)
class Waiter:
    key: str
    client: int
    since: float
    memory: int = MEMORY
    priority: int = 1


@attrs.frozen
class Client:
    """Asks for C{models} in turn, each request taking C{seconds}, C{think} seconds apart."""

    models: tuple[str, ...]
    seconds: float = 1.0
    think: float = 0.0


@attrs.define
class Run:
    waits: list[float] = attrs.Factory(list)
    loads: int = 0
    served: int = 0
    #: Waits of the requests still queued when the run ended.
    unserved: list[float] = attrs.Factory(list)
    broken: list[str] = attrs.Factory(list)


def simulate(
    clients: Sequence[Client],
    load: dict[str, float],
    rules: Rules,
    parallel: int = 2,
    until: float = 200.0,
) -> Run:
    """Run C{clients} for C{until} seconds under C{rules}; what happened."""
    sim = _Sim(clients, load, rules, parallel)
    sim.run(until)
    return sim.result


class _Sim:
    def __init__(self, clients: Sequence[Client], load: dict[str, float], rules: Rules, parallel: int):
        self.clients, self.load, self.rules, self.parallel = clients, load, rules, parallel
        self.now = 0.0
        self.runners: dict[str, Runner] = {}
        self.queue: list[Waiter] = []
        self.asked = [0] * len(clients)
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.result = Run()
        self.wake: float | None = None

    def at(self, when: float, kind: str, what: object) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, what))

    def run(self, until: float) -> None:
        for n in range(len(self.clients)):
            self.at(0.0, "ask", n)
        while self.events and self.events[0][0] <= until:
            self.now, _, kind, what = heapq.heappop(self.events)
            getattr(self, kind)(what)
            self.pump()
        self.result.unserved = [until - w.since for w in self.queue]

    def ask(self, n: object) -> None:
        assert isinstance(n, int)
        client = self.clients[n]
        model = client.models[self.asked[n] % len(client.models)]
        self.asked[n] += 1
        self.queue.append(Waiter(model, n, self.now))

    def done(self, what: object) -> None:
        key, n = what  # type: ignore[misc]
        runner = self.runners[key]
        runner.in_use -= 1
        if not runner.in_use:
            runner.finished_at = self.now
        self.at(self.now + self.clients[n].think, "ask", n)

    def ready(self, key: object) -> None:
        assert isinstance(key, str)
        runner = self.runners[key]
        runner.state, runner.loaded_at, runner.finished_at = State.READY, self.now, self.now
        runner.load_seconds = self.load[key]

    def woken(self, when: object) -> None:
        pass

    def pump(self) -> None:
        for _ in range(100):
            decision = policy.plan(
                self.queue, self.runners, [], Limits(4, BUDGET), now=self.now, rules=self.rules
            )
            if not self.act(decision):
                break
        if decision.wake_at is not None and decision.wake_at != self.wake:
            self.wake = decision.wake_at
            self.at(decision.wake_at, "woken", None)

    def act(self, decision: policy.Plan[Waiter, str]) -> bool:
        changed = False
        for waiter in decision.assign:
            runner = self.runners[waiter.key]
            runner.in_use += 1
            runner.served += 1
            self.queue.remove(waiter)
            self.result.waits.append(self.now - waiter.since)
            self.result.served += 1
            self.at(self.now + self.clients[waiter.client].seconds, "done", (waiter.key, waiter.client))
            changed = True
        for key in decision.evict:
            if self.runners[key].in_use:
                self.result.broken.append(f"{self.now}: busy {key} evicted")
            del self.runners[key]
            changed = True
        for key in decision.drain:
            self.runners[key].state = State.DRAINING
            changed = True
        for waiter in decision.load:
            self.runners[waiter.key] = Runner(State.LOADING, self.parallel)
            self.result.loads += 1
            self.at(self.now + self.load[waiter.key], "ready", waiter.key)
            changed = True
        for key in policy.drained(self.runners):
            del self.runners[key]
            changed = True
        if sum(r.memory for r in self.runners.values()) > BUDGET:
            self.result.broken.append(f"{self.now}: over the budget")
        return changed
