"""Keep-alive connections to runners, by socket path, and the sending of requests over them."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import ClientFactory
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from mrunner.errors import BadGateway
from mrunner.proxy.answer import Answer
from mrunner.proxy.connection import NotAnswered, RunnerConnection
from mrunner.proxy.fastio import RecvConnector
from mrunner.proxy.wire import Malformed, request_bytes

#: Drop pooled connections before llama-server's own 5 s keep-alive does.
POOL_IDLE_SECONDS = 4.0

#: Opens a connection to the runner at a socket path: C{connect(socket, pool)}.
Connect = Callable[[str, "RunnerPool"], Deferred[RunnerConnection]]


class RunnerPool:
    """Keep-alive connections to runners, by socket, and the sending of requests over them.

    A connection idle for C{POOL_IDLE_SECONDS} is never reused. A request that a
    reused connection took to its close unanswered (the runner had closed it
    while announcing keep-alive, a race llama-server runs after streams) is
    sent again on a new connection: a new connection that closes unanswered
    has had the request read, and that is the runner's answer (a 502).
    """

    def __init__(self, clock: IReactorTime, connect: Connect, per_socket: int):
        self._clock = clock
        self._connect = connect
        self._per_socket = per_socket
        self._idle: dict[str, list[RunnerConnection]] = {}

    def fetch(self, socket: str, path: bytes) -> Deferred[tuple[int, bytes]]:
        """C{GET path} of the runner at C{socket}, on a connection of its own: its status and whole body."""
        return Deferred.fromCoroutine(self._fetch(socket, path))

    async def _fetch(self, socket: str, path: bytes) -> tuple[int, bytes]:
        answer = await self.request(b"GET", socket, path, Headers(), b"", reuse=False)
        return answer.code, await answer.read()

    def request(
        self, method: bytes, socket: str, path: bytes, headers: Headers, body: bytes, reuse: bool = True
    ) -> Deferred[Answer]:
        """Send a request for C{path} to the runner at C{socket}; fires with its L{Answer}, head read.

        Without C{reuse}, the request goes on a connection of its own, closed
        after the answer: mrunner's own checks leave the kept connections to
        the requests they serve.

        @raise BadGateway: the runner could not be reached, or closed a new connection unanswered.
        """
        if not reuse:
            headers.setRawHeaders(b"connection", [b"close"])
        data = request_bytes(method, path, headers, body)
        return Deferred.fromCoroutine(self._request(method, socket, data, reuse))

    async def _request(self, method: bytes, socket: str, data: bytes, reuse: bool) -> Answer:
        connection = self._take(socket) if reuse else None
        if connection is not None:
            try:
                return Answer(connection, await connection.send(method, data))
            except NotAnswered:
                pass  # it was closing: a new connection is known to be fresh
            except Malformed as e:
                raise BadGateway(str(e)) from None
        try:
            connection = await self._connect(socket, self)
        except (ConnectError, NotAnswered) as e:
            raise BadGateway(f"the runner cannot be reached: {why(e)}") from None
        connection.reusable = reuse
        try:
            return Answer(connection, await connection.send(method, data))
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


def why(error: BaseException) -> str:
    """A short phrase for why a connection failed, such as "connection refused"."""
    os_error = getattr(error, "osError", None)
    if isinstance(os_error, int):
        return os.strerror(os_error).lower()
    return str(error).rstrip(".") or type(error).__name__


class _Connecting(ClientFactory):
    """Builds the one connection a connect attempt makes, failing its Deferred if the attempt does."""

    noisy = False  # "Starting factory" and "Stopping factory" in the log for every connection otherwise

    def __init__(self, connection: RunnerConnection):
        self._connection = connection

    def buildProtocol(self, addr: Any) -> RunnerConnection:
        return self._connection

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if not self._connection.opened.called:
            self._connection.opened.errback(reason)


def unix_connect(reactor: Any) -> Connect:
    """Connects to a runner's socket with C{reactor}, through the plain-C{recv} transport."""

    def connect(socket: str, pool: RunnerPool) -> Deferred[RunnerConnection]:
        connection = RunnerConnection(pool, socket)
        connector = RecvConnector(socket, _Connecting(connection), 30, reactor, False)
        connection.opened = Deferred(lambda d: connector.stopConnecting())
        connector.connect()
        return connection.opened

    return connect
