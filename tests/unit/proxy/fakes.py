"""Fakes for the runner package's tests: connections over StringTransports, a body that records."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel, Request

from mrunner.proxy.connection import BodyReceiver, RunnerConnection
from mrunner.proxy.pool import RunnerPool

CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENTS = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]
CHUNKS = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"


class Connections:
    """Connects every request to a new StringTransport, and remembers them all; or refuses."""

    def __init__(self) -> None:
        self.made: list[tuple[RunnerConnection, StringTransport]] = []
        self.refuse = False

    def __call__(self, socket: str, pool: RunnerPool) -> Deferred[RunnerConnection]:
        connection = RunnerConnection(pool, socket)
        if self.refuse:
            connection.opened.errback(ConnectionRefusedError(osError=111))
            return connection.opened
        transport = StringTransport()
        connection.makeConnection(transport)
        self.made.append((connection, transport))
        return connection.opened


class Recorder(BodyReceiver):
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.ended = False
        self.cut_because: tuple[str, bool] | None = None

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def end(self) -> None:
        self.ended = True

    def cut(self, why: str, between_chunks: bool) -> None:
        self.cut_because = (why, between_chunks)


def lost(connection: RunnerConnection) -> None:
    connection.connectionLost(Failure(ConnectionDone()))


def client_request(version: bytes = b"HTTP/1.1") -> tuple[Request, StringTransport]:
    """A client's POST, over a StringTransport, as twisted.web's channel makes it."""
    transport = StringTransport()
    channel = HTTPChannel()
    channel.makeConnection(transport)
    request = Request(channel)
    channel.requests.append(request)
    request.method, request.clientproto = b"POST", version
    return request, transport


def runner_sends(runner: RunnerConnection, data: tuple[bytes, ...], cut: bool) -> None:
    """The runner sends C{data}, then (with C{cut}) closes the connection."""
    for piece in data:
        runner.dataReceived(piece)
    if cut:
        lost(runner)
