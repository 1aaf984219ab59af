"""Whether the loader takes new requests: open, draining (what was accepted is still served), or
closed; and the drain's Deferreds, fired once nothing waits and nothing is served."""

from __future__ import annotations

from twisted.internet.defer import Deferred

from mrunner.scheduling import refusals


class Gate:
    """The loader's door to new requests, and its count of leases held."""

    def __init__(self) -> None:
        self.closed = False
        self.draining = False
        #: Leases handed out and not yet released.
        self.leased = 0
        self._drained: list[Deferred[None]] = []

    def admit(self) -> None:
        """Raise L{Unavailable} when no new request is taken: closed, or draining."""
        if self.closed:
            raise refusals.shutting_down()
        if self.draining:
            raise refusals.draining()

    def drain(self, queued: int) -> Deferred[None]:
        """Take no new request from now on; fire once none of the C{queued} waits and no lease is held."""
        self.draining = True
        done: Deferred[None] = Deferred()
        self._drained.append(done)
        self.settle(queued)
        return done

    def settle(self, queued: int) -> None:
        """Fire the drain's Deferreds once nothing is C{queued} and nothing is served."""
        if self._drained and not queued and not self.leased:
            done, self._drained = self._drained, []
            for d in done:
                d.callback(None)
