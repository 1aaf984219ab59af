"""The one relay of a runner's answer body to a client: as it arrives, with backpressure.

The runner's transport is registered as the client request's producer, so a
client that reads slowly pauses the runner's connection, and nothing is
buffered. A runner that stops mid-answer is told to the client in the API's
own words (an L{ErrorEvent}, given by the API) where the body can carry it,
else by cutting the client's connection, so that the client sees a truncated
answer rather than a complete-looking one.

A request's record sees what its client is sent, one way for every API: it
watches the request's writes (L{record_writes}), and the relay, which sends
past C{request.write} once the head is out, tells it those bytes too.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer, ITCPTransport
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.errors import BadGateway, MrunnerError
from mrunner.proxy.connection import BodyReceiver, RunnerConnection
from mrunner.proxy.fastio import send_now

#: An API's error as bytes of a body already begun (for OpenAI, a server-sent C{data:} event).
ErrorEvent = Callable[[MrunnerError], bytes]


class Observer(Protocol):
    """Sees an answer as it goes (a request's record, a key's meter): it must be cheap, it runs for every
    chunk."""

    def start(self, chunked: bool) -> None:
        """The answer's head is in; C{chunked} when C{write} will see the chunks' framing too."""

    def write(self, data: bytes) -> None:
        """C{data} of the answer came by."""


class Recorded:
    """A request's C{write}, which shows C{observer} (its record) each piece first (L{record_writes}).

    The request holds this, so this holds the request weakly: a strong reference
    back would make a cycle, and every finished request would wait for the cyclic
    garbage collector (1,000 streams: 17 MB more at their peak).
    """

    def __init__(self, request: Request, observer: Observer):
        self._request = weakref.ref(request)
        self._write = type(request).write
        self.observer = observer

    def __call__(self, data: bytes) -> None:
        if data:  # an empty write sends the head alone: the answer's first byte is its body's
            self.observer.write(data)
        request = self._request()
        if request is not None:
            self._write(request, data)


def record_writes(request: Request, observer: Observer) -> None:
    """Show C{observer} every byte of the answer C{request}'s client is sent, however it is written."""
    request.write = Recorded(request, observer)  # type: ignore[method-assign]


def unrecorded(request: Request, data: bytes) -> None:
    """Write C{data} to C{request}'s client unseen by its record (L{record_writes}): not the answer."""
    type(request).write(request, data)


def recorder(request: IRequest) -> Observer | None:
    """What sees C{request}'s writes (L{record_writes}), if anything does."""
    write = request.write
    return write.observer if isinstance(write, Recorded) else None


def stopped_midway(why: str) -> BadGateway:
    """The error a client is told when its runner stopped before the end of the answer."""
    return BadGateway(f"the runner stopped in the middle of the answer: {why}")


def is_event_stream(content_type: bytes) -> bool:
    return content_type.split(b";")[0].strip().lower() == b"text/event-stream"


def start_event_stream(request: Request) -> None:
    """Send the headers now, as the runner did, and every event as soon as it is written.

    Twisted holds the headers until the first body write, which for a stream is
    the first token; and Nagle's algorithm may hold a small event back until
    the client acknowledges the one before (nginx sets TCP_NODELAY likewise).
    """
    transport = request.channel.transport if request.channel is not None else None
    if ITCPTransport.providedBy(transport):
        transport.setTcpNoDelay(True)
    request.write(b"")


class Relay(BodyReceiver):
    """Writes a runner's answer body to the client as it arrives; C{done} fires when it has ended.

    C{framed}: the body keeps the runner's chunk framing (Twisted was told not
    to frame it again). C{error_event}: how this API tells a client in the
    body that the runner stopped; C{None} where the body cannot carry it.
    C{observer} (the key's meter) sees the body relayed; the
    request's record (L{recorder}) what the client was sent. Cancelling
    C{done} (the client went away) aborts the runner's connection. C{taken},
    while the fast relay moves the body (L{mrunner.proxy.fastrelay}), has it
    give the connections back first.
    """

    log = Logger()

    def __init__(
        self,
        request: Request,
        connection: RunnerConnection,
        framed: bool,
        error_event: ErrorEvent | None,
        observer: Observer | None = None,
    ):
        self.request = request
        self._connection = connection
        self.taken: Callable[[], None] | None = None
        self._framed = framed
        self._error_event = error_event
        self._observer = observer
        self._recorder = recorder(request)
        for watching in self.watching():
            watching.start(framed)
        self.done: Deferred[None] = Deferred(self._cancel)
        producer: IPushProducer = connection.transport  # type: ignore[assignment]
        request.registerProducer(producer, True)

    def _cancel(self, done: Deferred[None]) -> None:
        if self.taken is not None:
            self.taken()
        self._connection.abort()

    def watching(self) -> list[Observer]:
        """What sees the body relayed: the key's meter, the request's record."""
        return [watching for watching in (self._observer, self._recorder) if watching is not None]

    def write(self, data: bytes) -> None:
        request = self.request
        if request.startedWriting and not request.chunked and request.channel is not None:
            send_now(request.channel.transport, data)
            if self._recorder is not None:
                self._recorder.write(data)
        else:
            request.write(data)
        if self._observer is not None:
            self._observer.write(data)

    def end(self) -> None:
        if self.request.channel is not None:
            self.request.unregisterProducer()
        if not self.done.called:
            self.done.callback(None)

    def cut(self, why: str, between_chunks: bool) -> None:
        """Tell the client the runner stopped, in an error event where the body can take one; else cut it.

        Passing the runner's chunks through, the error event is a chunk of its
        own, and Twisted ends the body; a chunk cut in its middle cannot be ended.
        """
        request = self.request
        if self.done.called or request.channel is None:
            return  # the client is gone, and the request with it
        request.unregisterProducer()
        self.log.warn("runner stopped mid-answer: {why}", why=why)
        if self._framed and between_chunks:
            request.chunked = True
        if self._error_event is not None and (between_chunks or not self._framed):
            request.write(self._error_event(stopped_midway(why)))
        else:
            request.channel.transport.abortConnection()  # type: ignore[union-attr]
        self.done.callback(None)
