"""Forwards a request to a runner over its UNIX socket and streams the answer back.

This plays the role of twisted.web's C{ReverseProxyResource}, which speaks
HTTP/1.0 over TCP, buffers nothing but has no backpressure, and ignores client
disconnects. Here the runner's transport is registered as the client request's
producer, a client that goes away aborts the upstream connection (so
llama-server stops generating), and nothing is buffered.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.endpoints import UNIXClientEndpoint
from twisted.internet.error import ConnectError, ConnectingCancelledError
from twisted.internet.interfaces import IConsumer, IPushProducer, ITCPTransport
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
    Agent,
    HTTPConnectionPool,
    RequestNotSent,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseNeverReceived,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IAgentEndpointFactory, IBodyProducer, IResponse
from twisted.web.server import Request
from zope.interface import implementer

from mrunner.errors import BadGateway
from mrunner.home import SOCKET_SUFFIX

# RFC 9110 §7.6.1 hop-by-hop fields, and those twisted.web sets itself.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)

# Drop pooled connections before llama-server's own 5 s keep-alive does, so a
# POST never races a server-side close.
POOL_IDLE_SECONDS = 4
# Runner sockets are <run_dir>/<name>.sock (see mrunner.home); requests name them as
# http://<name>/. The names are spelled with os.path: pathlib interns every part, per request.


@implementer(IAgentEndpointFactory)
class RunnerEndpoints:
    """Maps C{http://<name>/...} to the UNIX socket C{<run_dir>/<name>.sock}."""

    def __init__(self, reactor: object, run_dir: Path):
        self._reactor = reactor
        self._run_dir = str(run_dir)

    def endpointForURI(self, uri: URI) -> UNIXClientEndpoint:
        socket = os.path.join(self._run_dir, uri.host.decode() + SOCKET_SUFFIX)
        return UNIXClientEndpoint(self._reactor, socket)


def connection_pool(reactor: object, per_host: int) -> HTTPConnectionPool:
    """A persistent pool that drops idle connections before the runner would."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = per_host
    pool.cachedConnectionTimeout = POOL_IDLE_SECONDS
    return pool


def runner_agent(reactor: object, run_dir: Path, pool: HTTPConnectionPool) -> Agent:
    """An Agent that reaches runners by their socket name, through C{pool}."""
    return Agent.usingEndpointFactory(reactor, RunnerEndpoints(reactor, run_dir), pool)


def runner_url(socket: str, path: bytes) -> bytes:
    """The URL that reaches C{path} on the runner listening on C{socket}."""
    return b"http://" + os.path.basename(socket).removesuffix(SOCKET_SUFFIX).encode() + path


@implementer(IBodyProducer)
class BytesBody:
    """A request body already in memory, sent with its Content-Length."""

    def __init__(self, data: bytes):
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def forwarded_headers(headers: Headers) -> Headers:
    """A copy of C{headers} without hop-by-hop fields, those C{Connection} names included."""
    named = {
        token.strip().lower()
        for value in headers.getRawHeaders(b"connection", [])
        for token in value.split(b",")
    }
    kept = Headers()
    for name, values in headers.getAllRawHeaders():
        if name.lower() not in HOP_BY_HOP and name.lower() not in named:
            kept.setRawHeaders(name, values)
    return kept


class Forwarder:
    """Sends requests to runners through one persistent C{Agent}."""

    log = Logger()

    def __init__(self, agent: Agent):
        self._agent = agent

    async def forward(self, request: Request, socket: str, path: bytes, body: bytes) -> None:
        """Relay C{request} (whose body is C{body}) to the runner; returns when the answer is sent.

        Cancelling the Deferred that awaits it (Klein does, when the client
        disconnects) aborts the upstream connection.
        """
        response = await self._send(request, runner_url(socket, path), body)
        request.setResponseCode(response.code, response.phrase)
        for name, values in forwarded_headers(response.headers).getAllRawHeaders():
            request.responseHeaders.setRawHeaders(name, values)
        if response.length is not UNKNOWN_LENGTH:
            request.responseHeaders.setRawHeaders(b"content-length", [b"%d" % response.length])
        events = is_event_stream(response.headers)
        if events:
            start_event_stream(request)
        relay = _Relay(request, events)
        response.deliverBody(relay)
        await relay.done

    async def _send(self, request: Request, url: bytes, body: bytes, retry: bool = True) -> IResponse:
        """The runner's response, once its headers are in.

        llama-server closes a connection after a stream while announcing
        keep-alive, so a pooled connection can die under the next request
        before the runner reads it: such a request is sent once more. A client
        that went away meanwhile cancelled it, and that stays a cancellation,
        which Klein expects, rather than an error logged with its traceback.
        """
        headers = forwarded_headers(request.requestHeaders)
        try:
            return await self._agent.request(request.method, url, headers, BytesBody(body))
        except ConnectingCancelledError:
            raise CancelledError() from None
        except (ResponseNeverReceived, RequestNotSent, RequestTransmissionFailed) as e:
            if request.channel is None:
                raise CancelledError() from None
            if retry:
                return await self._send(request, url, body, retry=False)
            raise BadGateway(f"the runner closed the connection before answering: {e}") from None
        except ConnectError as e:
            raise BadGateway(f"the runner cannot be reached: {e}") from None


def is_event_stream(headers: Headers) -> bool:
    content_type = headers.getRawHeaders(b"content-type", [b""])[0]
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


class _Relay(Protocol):
    """Writes a runner's response body to the client as it arrives, with backpressure."""

    def __init__(self, request: Request, events: bool):
        self._request = request
        self._events = events
        self._aborted = False
        self.done: Deferred[None] = Deferred(lambda d: self.abort())

    def connectionMade(self) -> None:
        producer: IPushProducer = self.transport  # type: ignore[assignment]
        self._request.registerProducer(producer, True)

    def dataReceived(self, data: bytes) -> None:
        self._request.write(data)

    def abort(self) -> None:
        """The client went away: close the runner connection now."""
        self._aborted = True
        self.transport.stopProducing()  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        if self._aborted or self._request.channel is None:
            return  # the client is gone, and the request with it
        self._request.unregisterProducer()
        if not reason.check(ResponseDone):
            Forwarder.log.warn("runner response cut short: {why}", why=reason.getErrorMessage())
            self._cut_short(reason)
        self.done.callback(None)

    def _cut_short(self, reason: Failure) -> None:
        """Tell a streaming client the runner died; make any other client see a truncated body."""
        if self._events:
            error = BadGateway(f"the runner stopped in the middle of the answer: {reason.getErrorMessage()}")
            self._request.write(b"data: " + json.dumps(error.body()).encode() + b"\n\n")
        else:
            self._request.channel.transport.abortConnection()  # type: ignore[union-attr]
