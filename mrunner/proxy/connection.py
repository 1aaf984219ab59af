"""One keep-alive connection to a runner: a request at a time, its answer's body handed on as it comes."""

from __future__ import annotations

from typing import Protocol as Shape

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from mrunner.proxy.fastio import send_now
from mrunner.proxy.wire import CHUNKED, CLOSE, EMPTY, LENGTH, MAX_HEAD, ChunkedEnd, Head, Malformed


class NotAnswered(Exception):
    """The connection closed, or could not be written, before any byte of an answer came."""


class BodyReceiver:
    """Where an answer's body goes: C{write} each piece, then C{end}, or C{cut} with why it stopped.

    C{cut}'s C{between_chunks} says whether a chunked body was cut where a chunk could still follow.
    """

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError

    def cut(self, why: str, between_chunks: bool) -> None:
        raise NotImplementedError


class Keeper(Shape):
    """Where a connection goes back once its answer has ended, and is forgotten once closed (the pool):
    a shape, so that the connection needs nothing of the pool's module."""

    def put(self, connection: RunnerConnection) -> None: ...

    def forget(self, connection: RunnerConnection) -> None: ...


class RunnerConnection(Protocol):
    """One keep-alive connection to a runner: a request at a time, its answer relayed as it comes."""

    def __init__(self, pool: Keeper, socket: str):
        self._pool = pool
        self.socket = socket
        #: False for a connection made for one answer alone, closed after it (L{RunnerPool.request}).
        self.reusable = True
        self.served = 0  # answers completed on this connection
        self.idle_since = 0.0
        self.opened: Deferred[RunnerConnection] = Deferred()
        self._method = b""
        self._answered: Deferred[Head] | None = None
        self._head = b""
        self._framing = EMPTY
        self._keep_alive = False
        self._rest = b""  # body bytes that came with the head, before the relay began
        self._remaining = 0  # of a Content-Length body
        self._chunks: ChunkedEnd | None = None
        self._held = b""  # the body's bytes not passed on yet (L{ChunkedEnd.held})
        self._payload: list[bytes] | None = None  # de-chunked pieces, when the body wants no framing
        self._body: BodyReceiver | None = None
        self._lost = False
        self._closed: Deferred[None] | None = None

    def connectionMade(self) -> None:
        self.opened.callback(self)

    def send(self, method: bytes, data: bytes) -> Deferred[Head]:
        """Write a whole request; the Deferred fires with the answer's head (cancel: abort)."""
        self._method = method
        self._head = b""
        answered: Deferred[Head] = Deferred(self._cancel)
        self._answered = answered
        send_now(self.transport, data)
        return answered

    def _cancel(self, answered: Deferred[Head]) -> None:
        self._answered = None
        self.abort()

    def relay(self, body: BodyReceiver, framed: bool) -> None:
        """Hand the body to C{body}: with its chunk framing when C{framed}, else as bare data."""
        self._body = body
        self._held = b""
        self._chunks = ChunkedEnd() if self._framing == CHUNKED else None
        self._payload = None if framed or self._chunks is None else []
        rest, self._rest = self._rest, b""
        if self._framing == EMPTY:
            self._finish(b"")
        elif rest:
            self.dataReceived(rest)
        if self._lost and self._body is not None:
            self._closed_in_body()

    @property
    def relaying(self) -> BodyReceiver | None:
        """Where the body being relayed goes, until it has ended."""
        return self._body

    @property
    def chunks(self) -> ChunkedEnd | None:
        """Where a chunked body relayed with its framing ends, read as it goes (L{ChunkedEnd}); None
        also while some of its bytes are held back, which must go out before any that follow."""
        return self._chunks if self._payload is None and not self._held else None

    def ended_elsewhere(self, extra: bytes) -> None:
        """The body's bytes were moved past this protocol (L{mrunner.proxy.fastrelay}) to its end;
        C{extra} came after it."""
        self._finish(b"", extra)

    def close(self) -> Deferred[None]:
        """Close the connection; fires when it is closed."""
        self._keep_alive = False
        self._closed = Deferred()
        self.transport.loseConnection()  # type: ignore[union-attr]
        return self._closed

    def abort(self) -> None:
        """Close at once: the client went away, and the runner must stop generating."""
        self._keep_alive = False
        self.transport.abortConnection()  # type: ignore[union-attr]

    def _chunked(self, body: BodyReceiver, chunks: ChunkedEnd, data: bytes) -> None:
        """A piece of a chunked body: on with its framing, but what L{ChunkedEnd.held} says to keep
        back; or without it, its chunks' data."""
        payload = self._payload
        end = chunks.feed(data, payload)
        if payload is None:
            held, self._held = self._held, b""
            if end >= 0:
                self._finish(held + data[:end], data[end:])
                return
            data = held + data
            cut = len(data) - chunks.held  # a size line or the body's end, not yet whole
            self._held = data[cut:]
            if cut:
                body.write(data[:cut])
            return
        for piece in payload:
            body.write(piece)
        payload.clear()
        if end >= 0:
            self._finish(b"", data[end:])

    def dataReceived(self, data: bytes) -> None:
        body = self._body
        if body is not None:
            if self._chunks is not None:
                self._chunked(body, self._chunks, data)
            elif self._framing == LENGTH:
                self._remaining -= len(data)
                if self._remaining > 0:
                    body.write(data)
                else:
                    cut = len(data) + self._remaining
                    self._finish(data[:cut], data[cut:])
            else:
                body.write(data)
            return
        if self._answered is None:
            if self._framing == EMPTY:  # unasked-for bytes on an idle connection: never reuse it
                self._keep_alive = False
                self.transport.loseConnection()  # type: ignore[union-attr]
            else:
                self._rest += data
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_HEAD:
                self._fail(Malformed("the answer's head is longer than 64 KiB"))
            return
        try:
            head = Head(self._head[:end], self._method)
        except Malformed as e:
            self._fail(e)
            return
        rest, self._head = self._head[end + 4 :], b""
        if 100 <= head.code < 200:  # an interim answer: the real one follows
            self._head = b""
            if rest:
                self.dataReceived(rest)
            return
        self._framing, self._keep_alive, self._remaining = head.framing, head.keep_alive, head.length
        self._rest = rest
        answered, self._answered = self._answered, None
        answered.callback(head)

    def _finish(self, last: bytes, extra: bytes = b"") -> None:
        body, self._body = self._body, None
        self._framing = EMPTY
        if last and body is not None:
            body.write(last)
        if extra:
            self._keep_alive = False  # nothing was asked for: the connection is out of step
        if self._keep_alive and self.reusable and not self._lost:
            self.served += 1
            self.transport.resumeProducing()  # type: ignore[union-attr]  # a client may have paused it
            self._pool.put(self)
        elif not self._lost:
            self.transport.loseConnection()  # type: ignore[union-attr]
        if body is not None:
            body.end()

    def _fail(self, error: Exception) -> None:
        self._keep_alive = False
        answered, self._answered = self._answered, None
        self.transport.loseConnection()  # type: ignore[union-attr]
        if answered is not None:
            answered.errback(error)

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:  # noqa: B008
        self._lost = True
        self._pool.forget(self)
        if self._closed is not None:
            self._closed.callback(None)
        if not self.opened.called:
            self.opened.errback(NotAnswered("the runner closed the connection at once"))
        answered, self._answered = self._answered, None
        if answered is not None:
            answered.errback(
                NotAnswered("the runner closed the connection before answering")
                if not self._head
                else Malformed("the runner closed the connection in the middle of the answer's head")
            )
        elif self._body is not None:
            self._closed_in_body()

    def _closed_in_body(self) -> None:
        if self._framing == CLOSE:
            self._finish(b"")
            return
        body, self._body = self._body, None
        if body is not None:
            between = self._chunks is not None and self._chunks.between_chunks()
            body.cut("its connection closed", between)
