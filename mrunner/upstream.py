"""mrunner's own HTTP/1.1 client for its runners: pooled keep-alive connections over UNIX sockets.

A runner is a known HTTP/1.1 server, so this parses only a response's status
line and headers, and hands the body on as it arrives, its framing included:
the end of a chunked body is found by reading the chunk-size lines alone,
never copying the data. Twisted's C{Agent} decodes every chunk (for the proxy
to encode it again), and its UNIX transport reads with C{recvmsg} and an
ancillary buffer: together about half the proxy's CPU per streamed event.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twisted.internet import tcp, unix
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.error import ConnectError, ConnectionDone
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from mrunner.errors import BadGateway
from mrunner.home import SOCKET_SUFFIX

#: Drop pooled connections before llama-server's own 5 s keep-alive does.
POOL_IDLE_SECONDS = 4.0
HEX_DIGITS = b"0123456789abcdefABCDEF"
#: A response head longer than this is not a runner's.
MAX_HEAD = 64 * 1024
#: How a response body ends: chunked framing, a Content-Length, the connection's close, or no body.
CHUNKED, LENGTH, CLOSE, EMPTY = "chunked", "length", "close", "empty"


class NotAnswered(Exception):
    """The connection closed, or could not be written, before any byte of an answer came."""


class Malformed(Exception):
    """The runner's bytes are not HTTP/1.1 this client understands."""


def send_now(transport: Any, data: bytes) -> None:
    """Write C{data} to a TCP or UNIX connection, sending it at once when nothing is queued before it.

    Twisted queues every write for the reactor's next turn, registering the
    socket for writability and unregistering it once sent: two C{epoll_ctl}
    calls and a turn of the loop for each request sent to a runner and each
    event streamed to a client, where the socket could take it at once. What
    the socket does not take is queued as before, and later writes queue
    behind it, so the order holds.
    """
    if (
        isinstance(transport, tcp.Connection)
        and not transport.TLS
        and transport.connected
        and not transport.disconnecting
        and not transport.dataBuffer
        and not transport._tempDataBuffer
    ):
        sent = transport.writeSomeData(data)
        if isinstance(sent, int):
            data = data[sent:]
    if data:
        transport.write(data)


class Head:
    """A response's status line and header fields, and how its body is framed."""

    __slots__ = ("code", "fields", "framing", "keep_alive", "length", "phrase")

    def __init__(self, data: bytes, method: bytes):
        lines = data.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, self.phrase = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise Malformed(f"the status line {lines[0][:80]!r} is not HTTP/1.x")
        self.code = int(code)
        #: (lower-case name, name, value) for every field, in order.
        self.fields: list[tuple[bytes, bytes, bytes]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise Malformed(f"the header line {line[:80]!r} has no colon")
            self.fields.append((name.strip().lower(), name.strip(), value.strip()))
        connection = self.tokens(b"connection")
        persistent = version == b"HTTP/1.1" or b"keep-alive" in connection
        self.keep_alive = persistent and b"close" not in connection
        self.length = -1
        if method == b"HEAD" or self.code in (204, 304):
            self.framing = EMPTY
        elif b"chunked" in self.tokens(b"transfer-encoding"):
            self.framing = CHUNKED
        elif (length := self.value(b"content-length")) is not None:
            if not length.isdigit():
                raise Malformed(f"Content-Length {length[:40]!r} is not a number")
            self.length = int(length)
            self.framing = LENGTH if self.length else EMPTY
        else:
            self.framing = CLOSE
            self.keep_alive = False

    def value(self, name: bytes) -> bytes | None:
        """The first value of field C{name} (lower case), if any."""
        for lower, _, value in self.fields:
            if lower == name:
                return value
        return None

    def tokens(self, name: bytes) -> set[bytes]:
        """The comma-separated tokens of every C{name} field, lower case."""
        return {
            token.strip().lower()
            for lower, _, value in self.fields
            if lower == name
            for token in value.split(b",")
        }


class ChunkedEnd:
    """Finds where a chunked body ends, reading its chunk-size lines alone.

    C{feed} is given each piece of the body as it arrives and answers where
    in it the body ended (-1: not yet). With C{payload} given, it also gets the
    chunks' data without their framing, for a client that cannot take chunks.
    """

    def __init__(self) -> None:
        self._skip = 0  # bytes of the current chunk's data, and its CRLF, still to come
        self._line = b""  # the start of a size or trailer line cut by the end of a read
        self._trailer = False  # past the last chunk: reading trailer lines until an empty one

    def between_chunks(self) -> bool:
        """Whether what was fed ends with a whole chunk, so another could follow."""
        return not self._skip and not self._line and not self._trailer

    def feed(self, data: bytes, payload: list[bytes] | None = None) -> int:
        skip = self._skip
        if skip >= len(data) and payload is None:
            self._skip = skip - len(data)  # the common case: a read inside a chunk's data
            return -1
        buffer, start = (self._line + data, len(self._line)) if self._line else (data, 0)
        self._line = b""
        position = 0
        while True:
            if skip:
                taken = min(skip, len(buffer) - position)
                if payload is not None and skip > 2:
                    payload.append(buffer[position : position + min(taken, skip - 2)])
                position += taken
                skip -= taken
                if skip:
                    self._skip = skip
                    return -1
                if position == len(buffer):  # the read ended with the chunk, as a runner's event does
                    self._skip = 0
                    return -1
            end = buffer.find(b"\r\n", position)
            if end < 0:
                self._line = buffer[position:]
                if len(self._line) > 4096:
                    raise Malformed("a chunk-size line is longer than 4 KiB")
                self._skip = 0
                return -1
            line = buffer[position:end]
            position = end + 2
            if self._trailer:
                if not line:
                    return position - start
                continue
            size = line.partition(b";")[0].strip()
            if not size or size.strip(HEX_DIGITS):
                raise Malformed(f"the chunk size {size[:40]!r} is not hexadecimal")
            skip = int(size, 16) + 2
            if skip == 2:
                self._trailer, skip = True, 0


class Body:
    """Where a response's body goes: C{write} each piece, then C{end}, or C{cut} with why it stopped.

    C{cut}'s C{between_chunks} says whether a chunked body was cut where a chunk could still follow.
    """

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError

    def cut(self, why: str, between_chunks: bool) -> None:
        raise NotImplementedError


class RunnerConnection(Protocol):
    """One keep-alive connection to a runner: a request at a time, its answer relayed as it comes."""

    def __init__(self, pool: RunnerPool, socket: str):
        self._pool = pool
        self.socket = socket
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
        self._payload: list[bytes] | None = None  # de-chunked pieces, when the body wants no framing
        self._body: Body | None = None
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

    def relay(self, body: Body, framed: bool) -> None:
        """Hand the body to C{body}: with its chunk framing when C{framed}, else as bare data."""
        self._body = body
        self._chunks = ChunkedEnd() if self._framing == CHUNKED else None
        self._payload = None if framed or self._chunks is None else []
        rest, self._rest = self._rest, b""
        if self._framing == EMPTY:
            self._finish(b"")
        elif rest:
            self.dataReceived(rest)
        if self._lost and self._body is not None:
            self._closed_in_body()

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

    def dataReceived(self, data: bytes) -> None:
        body = self._body
        if body is not None:
            if self._chunks is not None:
                payload = self._payload
                end = self._chunks.feed(data, payload)
                if payload is None:
                    if end < 0:
                        body.write(data)
                    else:
                        self._finish(data[:end], data[end:])
                    return
                for piece in payload:
                    body.write(piece)
                payload.clear()
                if end >= 0:
                    self._finish(b"", data[end:])
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
        if self._keep_alive and not self._lost:
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


class RunnerPool:
    """Keep-alive connections to runners, by socket, and the sending of requests over them.

    A connection idle for C{POOL_IDLE_SECONDS} is never reused. A request that a
    reused connection took to its close unanswered (the runner had closed it
    while announcing keep-alive, a race llama-server runs after streams) is
    sent again on a new connection: a new connection that closes unanswered
    has had the request read, and that is the runner's answer (a 502).
    """

    def __init__(
        self,
        clock: IReactorTime,
        connect: Callable[[str, RunnerPool], Deferred[RunnerConnection]],
        run_dir: str,
        per_socket: int,
    ):
        self._clock = clock
        self._connect = connect
        self._run_dir = run_dir
        self._per_socket = per_socket
        self._idle: dict[str, list[RunnerConnection]] = {}

    def request(
        self, method: bytes, url: bytes, headers: Headers, body: bytes
    ) -> Deferred[tuple[RunnerConnection, Head]]:
        """Send a request to C{url} (from L{runner_url}); fires with the connection and the answer's head.

        The body is then relayed from the connection (L{RunnerConnection.relay}).

        @raise BadGateway: the runner could not be reached, or closed a new connection unanswered.
        """
        name, slash, path = url.removeprefix(b"http://").partition(b"/")
        socket = os.path.join(self._run_dir, name.decode() + SOCKET_SUFFIX)
        data = request_bytes(method, slash + path, headers, body)
        return Deferred.fromCoroutine(self._request(method, socket, data))

    async def _request(self, method: bytes, socket: str, data: bytes) -> tuple[RunnerConnection, Head]:
        connection = self._take(socket)
        if connection is not None:
            try:
                return connection, await connection.send(method, data)
            except NotAnswered:
                pass  # it was closing: a new connection is known to be fresh
            except Malformed as e:
                raise BadGateway(str(e)) from None
        try:
            connection = await self._connect(socket, self)
        except (ConnectError, NotAnswered) as e:
            raise BadGateway(f"the runner cannot be reached: {why(e)}") from None
        try:
            return connection, await connection.send(method, data)
        except (NotAnswered, Malformed) as e:
            raise BadGateway(str(e)) from None

    def _take(self, socket: str) -> RunnerConnection | None:
        """The connection idle longest, but not too long: had the runner closed it, its close is in."""
        idle = self._idle.get(socket)
        now = self._clock.seconds()
        while idle:
            connection = idle.pop(0)
            if now - connection.idle_since < POOL_IDLE_SECONDS:
                return connection
            connection.transport.loseConnection()  # type: ignore[union-attr]
        return None

    def put(self, connection: RunnerConnection) -> None:
        """C{connection} finished an answer and may serve another."""
        idle = self._idle.setdefault(connection.socket, [])
        if len(idle) >= self._per_socket:
            connection.transport.loseConnection()  # type: ignore[union-attr]
            return
        connection.idle_since = self._clock.seconds()
        idle.append(connection)

    def forget(self, connection: RunnerConnection) -> None:
        """C{connection} closed: it is no longer one to reuse."""
        idle = self._idle.get(connection.socket)
        if idle and connection in idle:
            idle.remove(connection)
            if not idle:
                del self._idle[connection.socket]

    def close(self) -> Deferred[Any]:
        """Close every idle connection (the daemon is stopping); fires once they are closed."""
        idle = [connection for connections in self._idle.values() for connection in connections]
        self._idle.clear()
        return DeferredList([connection.close() for connection in idle])


def runner_url(socket: str, path: bytes) -> bytes:
    """The URL that reaches C{path} on the runner listening on C{socket} (<run_dir>/<name>.sock).

    The names are spelled with os.path: pathlib interns every part, per request.
    """
    return b"http://" + os.path.basename(socket).removesuffix(SOCKET_SUFFIX).encode() + path


def request_bytes(method: bytes, path: bytes, headers: Headers, body: bytes) -> bytes:
    """A whole HTTP/1.1 request, to be written at once."""
    parts = [method, b" ", path, b" HTTP/1.1\r\nHost: runner\r\nContent-Length: %d\r\n" % len(body)]
    for name, values in headers.getAllRawHeaders():
        for value in values:
            parts += (name, b": ", value, b"\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)


def why(error: BaseException) -> str:
    """A short phrase for why a connection failed, such as "connection refused"."""
    os_error = getattr(error, "osError", None)
    if isinstance(os_error, int):
        return os.strerror(os_error).lower()
    return str(error).rstrip(".") or type(error).__name__


class _RecvClient(unix.Client):
    """A UNIX client transport that reads with plain C{recv}: no file descriptors come from a runner."""

    doRead = tcp.Connection.doRead  # type: ignore[assignment]


class _Connector(unix.Connector):
    def _makeTransport(self) -> unix.Client:  # type: ignore[override]
        return _RecvClient(self.address, self, self.reactor, self.checkPID)


class _Connecting(ClientFactory):
    """Builds the one connection a connect attempt makes, failing its Deferred if the attempt does."""

    noisy = False  # two log events per connection otherwise

    def __init__(self, connection: RunnerConnection):
        self._connection = connection

    def buildProtocol(self, addr: Any) -> RunnerConnection:
        return self._connection

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if not self._connection.opened.called:
            self._connection.opened.errback(reason)


def unix_connect(reactor: Any) -> Callable[[str, RunnerPool], Deferred[RunnerConnection]]:
    """Connects to a runner's socket with C{reactor}, through the plain-C{recv} transport."""

    def connect(socket: str, pool: RunnerPool) -> Deferred[RunnerConnection]:
        connection = RunnerConnection(pool, socket)
        connector = _Connector(socket, _Connecting(connection), 30, reactor, False)
        connection.opened = Deferred(lambda d: connector.stopConnecting())
        connector.connect()
        return connection.opened

    return connect
