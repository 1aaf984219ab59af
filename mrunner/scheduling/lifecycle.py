"""A runner's life, in one place: LOADING → READY → DRAINING → STOPPING → ENDED.

The loader moves a runner through it and the policy decides from it; a move
the diagram does not allow raises L{IllegalMove}, so a bug shows up where it
happens instead of as a runner that is, say, both stopping and serving::

    LOADING ──ready──> READY ──drain──> DRAINING
       │                 │                 │
       └───────stop──────┴──────stop───────┴──> STOPPING ──end──> ENDED

A process can also end in any state (it crashed, or was killed): C{end} is
allowed from every state but ENDED.
"""

from __future__ import annotations

import attrs

from mrunner.values import State


class IllegalMove(Exception):
    """A transition the lifecycle does not have, e.g. READY after STOPPING."""


_MOVES: dict[State, frozenset[State]] = {
    State.LOADING: frozenset({State.READY, State.STOPPING, State.ENDED}),
    State.READY: frozenset({State.DRAINING, State.STOPPING, State.ENDED}),
    State.DRAINING: frozenset({State.STOPPING, State.ENDED}),
    State.STOPPING: frozenset({State.ENDED}),
    State.ENDED: frozenset(),
}


@attrs.define
class Lifecycle:
    """One runner's state; the methods are the only way to change it."""

    state: State = attrs.field(default=State.LOADING, init=False)

    @property
    def running(self) -> bool:
        """Loading, ready or draining: not yet told to stop, and not gone."""
        return self.state in (State.LOADING, State.READY, State.DRAINING)

    def ready(self) -> None:
        """The runner answered its health check."""
        self._move(State.READY)

    def drain(self) -> None:
        """Finish what it serves, take nothing new."""
        self._move(State.DRAINING)

    def stop(self) -> None:
        """Its process was told to stop (SIGTERM, SIGKILL after a grace)."""
        self._move(State.STOPPING)

    def end(self) -> State:
        """Its process is gone; returns the state it was in."""
        previous = self.state
        self._move(State.ENDED)
        return previous

    def _move(self, to: State) -> None:
        if to not in _MOVES[self.state]:
            raise IllegalMove(f"a runner cannot go from {self.state.value} to {to.value}")
        self.state = to
