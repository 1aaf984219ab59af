"""A runner's keep-alive: how long it may idle, whether it is pinned, and the timer that ends its idling.

The runner's machine cancels the timer whenever the runner stops being ready
and idle (L{mrunner.scheduling.lifecycle}); the loader starts it with
L{KeepAlive.rest} once it has nothing more to hand that runner.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime


class KeepAlive:
    """C{seconds} of idling before the runner goes (-1: never, 0: at once); a pinned runner never goes."""

    def __init__(self, clock: IReactorTime, seconds: float, pinned: bool):
        self._clock = clock
        self.seconds = seconds
        self.pinned = pinned
        self._call: IDelayedCall | None = None

    @property
    def expires_at(self) -> float | None:
        """When the running timer fires; None when none runs."""
        return self._call.getTime() if self._call is not None else None

    def rest(self, now: Callable[[], None], later: Callable[[], None]) -> None:
        """The runner is ready and idle: C{now()} for a keep-alive of 0, else C{later()} once it has run out.

        Nothing for a pinned runner, a keep-alive of -1, or a timer already running.
        """
        if self.pinned:
            return
        if self.seconds == 0:
            now()
        elif self.seconds > 0 and self._call is None:
            self._call = self._clock.callLater(self.seconds, self._expire, later)

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def _expire(self, later: Callable[[], None]) -> None:
        self._call = None
        later()
