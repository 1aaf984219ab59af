"""Requests to registries and the Hub that give up when the remote stops sending.

treq's C{collect} waits as long as the server keeps the connection open, and
C{timeout=} on a request covers only its headers (treq #88): a server that
sent the headers and 1,000 bytes and then nothing held a pull for as long as
its client waited. Here the answer must come within the timeout
(``[store] read_timeout``), and so must each piece of its body; the connection
is then cut. Cancelling a body's Deferred (its client left) cuts it at once, too.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import attrs
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse

from mrunner.errors import BadGateway

T = TypeVar("T")
#: Seconds a remote may send nothing (``[store] read_timeout``).
READ_TIMEOUT = 60.0


class Stalled(BadGateway):
    """Nothing came from the remote for the timeout; the connection was cut."""

    code = "registry_timeout"

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"{what} sent nothing for {seconds:g} s")


@attrs.frozen
class Timeout:
    """How long a remote may send nothing, on which clock."""

    clock: IReactorTime
    seconds: float = READ_TIMEOUT


async def answer(request: Deferred[T] | Coroutine[Any, Any, T], what: str, timeout: Timeout) -> T:
    """C{request}'s response, cancelled when C{what} sends none within the timeout.

    @raise Stalled: it timed out (whatever error the client made of the cancellation).
    """
    response: Deferred[T] = ensureDeferred(request)
    timer = timeout.clock.callLater(timeout.seconds, response.cancel)
    try:
        return await response
    except Exception:
        if timer.active():
            raise
        raise Stalled(what, timeout.seconds) from None
    finally:
        if timer.active():
            timer.cancel()


async def read_limited(response: IResponse, limit: int, what: str, timeout: Timeout) -> bytes:
    """The whole body, refusing more than C{limit} bytes, and a silence of the timeout."""
    chunks: list[bytes] = []
    received = 0

    def keep(data: bytes) -> None:
        nonlocal received
        received += len(data)
        if received > limit:
            raise BadGateway(f"{what} is larger than {limit} bytes", code="registry_error")
        chunks.append(data)

    await collect(response, keep, what, timeout)
    return b"".join(chunks)


async def discard(response: IResponse, what: str, timeout: Timeout) -> None:
    """Read and drop a body we do not use, so the connection can be reused."""
    await collect(response, lambda _: None, what, timeout)


def collect(
    response: IResponse, write: Callable[[bytes], None], what: str, timeout: Timeout
) -> Deferred[None]:
    """Hand C{response}'s body to C{write} as it arrives; fails with L{Stalled} when C{what} sends
    nothing for the timeout, with what C{write} raised, or with the connection's loss."""
    body = _Body(write, what, timeout)
    response.deliverBody(body)
    return body.done


class _Body(Protocol):
    def __init__(self, write: Callable[[bytes], None], what: str, timeout: Timeout) -> None:
        self._write = write
        self._what = what
        self._seconds = timeout.seconds
        self.done: Deferred[None] = Deferred(lambda _: self._stop())
        self._timer: IDelayedCall = timeout.clock.callLater(timeout.seconds, self._stalled)

    def dataReceived(self, data: bytes) -> None:
        if self.done.called:
            return
        self._timer.reset(self._seconds)
        try:
            self._write(data)
        except BaseException:
            self._end(Failure())

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._end(None if reason.check(ResponseDone, PotentialDataLoss) else reason)

    def _stalled(self) -> None:
        self._end(Failure(Stalled(self._what, self._seconds)))

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
