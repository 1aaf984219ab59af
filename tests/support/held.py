"""An answer's body held unread, so its runner stays busy while a test looks."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure


class Held(Protocol):
    """An answer's body, not read until the test resumes it."""

    def __init__(self) -> None:
        self.data = b""
        self.done: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        self.transport.pauseProducing()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.done.callback(None)
