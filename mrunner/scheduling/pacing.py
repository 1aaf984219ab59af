"""What the loader's plans weigh besides its queue and runners: rules, load times, when to look again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from mrunner.runners.runner import Runner
from mrunner.scheduling import policy, priority
from mrunner.scheduling.lease import Waiter
from mrunner.scheduling.load_times import LoadTimes
from mrunner.scheduling.order import Rules
from mrunner.values import RunnerKey


class Pacing:
    """The loader's L{Rules}, its models' L{LoadTimes}, and the one timer that plans again when
    time alone would change a plan (L{patience.wake_at})."""

    def __init__(self, rules: Rules, load_times: LoadTimes, replan: Callable[[], None]):
        self.rules = rules
        self.load_times = load_times
        self._replan = replan
        self._wake: IDelayedCall | None = None

    def plan(
        self,
        clock: IReactorTime,
        queue: Iterable[Waiter],
        runners: Mapping[RunnerKey, Runner],
        stopping: Sequence[Runner],
        limits: policy.Limits,
        instances: Callable[[Waiter], Sequence[RunnerKey]],
    ) -> policy.Plan[Waiter, RunnerKey]:
        """L{policy.plan} at C{clock}'s time: C{queue} in its priority order, beside what the
        C{stopping} runners hold; the timer set for the time it says to plan again."""
        now = clock.seconds()
        on_gpus = Counter[str]()
        for runner in stopping:
            on_gpus.update(runner.on_gpus)
        memory = [runner.memory for runner in stopping]
        ordered = priority.order(queue, now, self.rules.starvation)
        rules, costs = self.rules, self.costs(runners)
        decision = policy.plan(ordered, runners, memory, limits, dict(on_gpus), instances, now, rules, costs)
        self.wake_at(clock, decision.wake_at)
        return decision

    def loaded(self, runner: Runner) -> None:
        self.load_times.record(runner.key.model, runner.load_seconds)

    def costs(self, runners: Mapping[RunnerKey, Runner]) -> dict[RunnerKey, float]:
        """Seconds each runner would take to load again: the mean of its model's loads here."""
        return self.rules.order.costs(runners, lambda key: self.load_times.get(key.model))

    def wake_at(self, clock: IReactorTime, when: float | None) -> None:
        """Plan again at C{when} (None: no need), replacing the time asked for before."""
        if self._wake is not None and self._wake.active():
            if self._wake.getTime() == when:
                return
            self._wake.cancel()
        self._wake = None
        if when is not None:
            self._wake = clock.callLater(max(0.0, when - clock.seconds()), self._replan)

    def stop(self) -> None:
        if self._wake is not None and self._wake.active():
            self._wake.cancel()
        self._wake = None
