"""The load back-offs: a key whose load failed fails fast for a while (L{next_backoff})."""

from __future__ import annotations

import attrs
from twisted.internet.interfaces import IReactorTime

from mrunner.values import RunnerKey

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0


def next_backoff(previous: float | None) -> float:
    """Seconds a key whose load failed fails fast: 1 s, doubling, at most 60 s."""
    return BACKOFF_FIRST if previous is None else min(previous * 2, BACKOFF_MAX)


@attrs.define
class _Backoff:
    delay: float
    until: float


class Backoffs:
    """Each key's back-off: C{hold} after a failed load, C{clear} once one opens."""

    def __init__(self, clock: IReactorTime):
        self._clock = clock
        self._held: dict[RunnerKey, _Backoff] = {}

    def hold(self, key: RunnerKey) -> float:
        """Back C{key} off for the next delay after its last one; that delay, in seconds."""
        previous = self._held.get(key)
        delay = next_backoff(previous.delay if previous else None)
        self._held[key] = _Backoff(delay, self._clock.seconds() + delay)
        return delay

    def clear(self, *keys: RunnerKey) -> None:
        for key in keys:
            self._held.pop(key, None)

    def left(self, key: RunnerKey) -> float:
        """Seconds until C{key} may load again; 0 when it may now (the delay is kept until a load
        opens, so that the next failure doubles it)."""
        backoff = self._held.get(key)
        return 0.0 if backoff is None else max(0.0, backoff.until - self._clock.seconds())
