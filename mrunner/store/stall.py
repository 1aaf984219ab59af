"""Downloads that give up when the remote stops sending: an answer, then each byte, within a timeout.

treq's C{collect} waits as long as the server keeps the connection open, and
C{timeout=} on a request covers only its headers (treq #88): a server that
sent the headers and 1,000 bytes and then nothing held a pull for as long as
its client waited. Here the headers must come within the timeout, and so must
each piece of the body after them; the connection is then cut. Cancelling a
body's Deferred (its client left) cuts it at once, too.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse


class Stalled(Exception):
    """Nothing came from the remote for the timeout; the connection was cut."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"no byte in {timeout:g} s")


async def answer(request: Coroutine[Any, Any, IResponse], clock: IReactorTime, timeout: float) -> IResponse:
    """C{request}'s response, cancelled after C{timeout} seconds without one.

    @raise Stalled: it timed out (whatever error the client made of the cancellation).
    """
    response: Deferred[IResponse] = ensureDeferred(request)
    timer = clock.callLater(timeout, response.cancel)
    try:
        return await response
    except Exception:
        if timer.active():
            raise
        raise Stalled(timeout) from None
    finally:
        if timer.active():
            timer.cancel()


def collect(
    response: IResponse, write: Callable[[bytes], None], clock: IReactorTime, timeout: float
) -> Deferred[None]:
    """Hand C{response}'s body to C{write} as it arrives; fails with L{Stalled} after a silence of
    C{timeout} seconds, with what C{write} raised, or with the connection's loss."""
    body = _Body(write, clock, timeout)
    response.deliverBody(body)
    return body.done


class _Body(Protocol):
    def __init__(self, write: Callable[[bytes], None], clock: IReactorTime, timeout: float) -> None:
        self._write = write
        self._timeout = timeout
        self.done: Deferred[None] = Deferred(lambda _: self._stop())
        self._timer: IDelayedCall = clock.callLater(timeout, self._stalled)

    def dataReceived(self, data: bytes) -> None:
        if self.done.called:
            return
        self._timer.reset(self._timeout)
        try:
            self._write(data)
        except BaseException:
            self._end(Failure())

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._end(None if reason.check(ResponseDone, PotentialDataLoss) else reason)

    def _stalled(self) -> None:
        self._end(Failure(Stalled(self._timeout)))

    def _end(self, result: Failure | None) -> None:
        """Fire C{done} once; on failure (a write that failed, a stall), cut the connection."""
        if self.done.called:
            return
        if result is None:
            self._timer.cancel()
            self.done.callback(None)
        else:
            self._stop()
            self.done.errback(result)

    def _stop(self) -> None:
        if self._timer.active():
            self._timer.cancel()
        if self.transport is not None:
            self.transport.loseConnection()
