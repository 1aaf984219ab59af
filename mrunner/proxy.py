"""Forwards a request to a runner over its UNIX socket and streams the answer back.

This plays the role of twisted.web's C{ReverseProxyResource}, which speaks
HTTP/1.0 over TCP, buffers nothing but has no backpressure, and ignores client
disconnects. Here the runner's transport is registered as the client request's
producer, a client that goes away aborts the upstream connection (so
llama-server stops generating), and nothing is buffered. The runner side is
mrunner's own HTTP/1.1 client (L{mrunner.upstream}): a chunked answer goes to
an HTTP/1.1 client with its framing as the runner wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import UNIXClientEndpoint
from twisted.internet.interfaces import IPushProducer, ITCPTransport
from twisted.logger import Logger
from twisted.web.client import URI, Agent
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory
from twisted.web.server import Request
from zope.interface import implementer

from mrunner.clientpool import QuietPool
from mrunner.errors import BadGateway, ContextExceeded
from mrunner.home import SOCKET_SUFFIX
from mrunner.upstream import CHUNKED, Body, Head, RunnerConnection, RunnerPool, runner_url, send_now

# RFC 9110 §7.6.1 hop-by-hop fields, those twisted.web sets itself, and Expect (the body is here already).
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
        b"expect",
    }
)

# The daemon answers browsers' CORS itself (mrunner/api/door/site.py): a runner's own say is dropped.
RUNNER_CORS = frozenset(
    {
        b"access-control-allow-origin",
        b"access-control-allow-credentials",
        b"access-control-allow-methods",
        b"access-control-allow-headers",
        b"access-control-allow-private-network",
        b"access-control-expose-headers",
        b"access-control-max-age",
    }
)
# The client's key is for mrunner (mrunner/api/door/trust.py): a runner never sees it, nor logs it.
DAEMON_CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
NOT_RELAYED = HOP_BY_HOP | RUNNER_CORS | DAEMON_CREDENTIALS


__all__ = ["runner_url"]  # for the runner's health checks


@implementer(IAgentEndpointFactory)
class RunnerEndpoints:
    """Maps C{http://<name>/...} to the UNIX socket C{<run_dir>/<name>.sock}."""

    def __init__(self, reactor: object, run_dir: Path):
        self._reactor = reactor
        self._run_dir = run_dir

    def endpointForURI(self, uri: URI) -> UNIXClientEndpoint:
        return UNIXClientEndpoint(self._reactor, str(self._run_dir / (uri.host.decode() + SOCKET_SUFFIX)))


def health_agent(reactor: object, run_dir: Path) -> Agent:
    """An Agent for a runner's C{/health} while it loads: a new connection a poll, none kept."""
    pool = QuietPool(reactor, persistent=False)
    return Agent.usingEndpointFactory(reactor, RunnerEndpoints(reactor, run_dir), pool)


def forwarded_headers(headers: Headers) -> Headers:
    """A copy of C{headers} without hop-by-hop fields (those C{Connection} names included), CORS or keys."""
    named = {
        token.strip().lower()
        for value in headers.getRawHeaders(b"connection", [])
        for token in value.split(b",")
    }
    kept = Headers()
    for name, values in headers.getAllRawHeaders():
        if name.lower() not in NOT_RELAYED and name.lower() not in named:
            kept.setRawHeaders(name, values)
    return kept


def answer_fields(head: Head) -> Iterator[tuple[bytes, bytes]]:
    """The runner's header fields a client gets: not hop-by-hop (C{Connection}'s names included), not CORS."""
    named = head.tokens(b"connection")
    for lower, name, value in head.fields:
        if lower not in NOT_RELAYED and lower not in named:
            yield name, value


class Observer(Protocol):
    """Sees an answer as it is relayed (a request record): it must be cheap, it runs for every chunk."""

    def start(self, chunked: bool) -> None:
        """The answer's head is in; C{chunked} when C{write} will see the chunks' framing too."""

    def write(self, data: bytes) -> None:
        """C{data} went to the client."""


class Forwarder:
    """Sends requests to runners through one pool of keep-alive connections (L{RunnerPool})."""

    log = Logger()

    def __init__(self, pool: RunnerPool):
        self._pool = pool

    async def forward(
        self, request: Request, socket: str, path: bytes, body: bytes, observer: Observer | None = None
    ) -> None:
        """Relay C{request} (whose body is C{body}) to the runner; returns when the answer is sent.

        A 400 is read whole first: llama-server's refusal of a conversation longer
        than its context becomes L{ContextExceeded}, which says so plainly.

        Cancelling the Deferred that awaits it (Klein does, when the client
        disconnects) aborts the upstream connection. An C{observer} sees the
        answer's body as it goes to the client.
        """
        connection, head = await self._send(request, runner_url(socket, path), body)
        refusal = await _refusal(connection) if head.code == 400 else None
        request.setResponseCode(head.code, head.phrase)
        headers = request.responseHeaders
        for name, value in answer_fields(head):
            headers.addRawHeader(name, value)
        if head.length >= 0:
            headers.setRawHeaders(b"content-length", [b"%d" % head.length])
        if refusal is not None:
            if observer is not None:
                observer.start(False)
                observer.write(refusal)
            request.write(refusal)
            return
        events = is_event_stream(head.value(b"content-type") or b"")
        if events:
            start_event_stream(request)
        # An HTTP/1.1 client takes the runner's chunks as they are: Twisted sends the
        # headers saying chunked, and is then told not to frame the body a second time.
        framed = head.framing == CHUNKED and request.clientproto == b"HTTP/1.1"
        if framed:
            request.write(b"")
            request.chunked = False
        if observer is not None:
            observer.start(framed)
        del head  # not kept for the minutes a stream may last (1,000 streams: 0.5 MB)
        relay = _Relay(request, connection, events, framed, observer)
        connection.relay(relay, framed)
        await relay.done

    async def _send(self, request: Request, url: bytes, body: bytes) -> tuple[RunnerConnection, Head]:
        """The runner's connection and answer head, once the head is in (the pool resends after a race).

        A client that went away meanwhile cancelled it, and that stays a
        cancellation, which Klein expects, rather than an error logged with
        its traceback, whatever the cancelled step raised.
        """
        try:
            answer: tuple[RunnerConnection, Head] = await self._pool.request(
                request.method, url, forwarded_headers(request.requestHeaders), body
            )
        except Exception:
            if request.channel is None:
                raise CancelledError() from None
            raise
        return answer


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


async def _refusal(connection: RunnerConnection) -> bytes:
    """A runner's 400, a few hundred bytes, read whole: L{ContextExceeded} when it is the context."""
    held = _Held(connection)
    connection.relay(held, framed=False)
    answer = await held.done
    exceeded = ContextExceeded.from_runner(answer)
    if exceeded is not None:
        raise exceeded
    return answer


class _Held(Body):
    """Keeps a short answer whole, for mrunner to read before the client does."""

    def __init__(self, connection: RunnerConnection):
        self._chunks: list[bytes] = []
        self.done: Deferred[bytes] = Deferred(lambda d: connection.abort())

    def write(self, data: bytes) -> None:
        self._chunks.append(data)

    def end(self) -> None:
        self.done.callback(b"".join(self._chunks))

    def cut(self, why: str, between_chunks: bool) -> None:
        self.done.errback(BadGateway(f"the runner stopped in the middle of its answer: {why}"))


class _Relay(Body):
    """Writes a runner's response body to the client as it arrives, with backpressure."""

    def __init__(
        self,
        request: Request,
        connection: RunnerConnection,
        events: bool,
        framed: bool,
        observer: Observer | None,
    ):
        self._request = request
        self._connection = connection
        self._events = events
        self._framed = framed
        self._observer = observer
        self.done: Deferred[None] = Deferred(lambda d: connection.abort())
        producer: IPushProducer = connection.transport  # type: ignore[assignment]
        request.registerProducer(producer, True)

    def write(self, data: bytes) -> None:
        request = self._request
        if request.startedWriting and not request.chunked and request.channel is not None:
            send_now(request.channel.transport, data)
        else:
            request.write(data)
        if self._observer is not None:
            self._observer.write(data)

    def end(self) -> None:
        if self._request.channel is not None:
            self._request.unregisterProducer()
        if not self.done.called:
            self.done.callback(None)

    def cut(self, why: str, between_chunks: bool) -> None:
        """Tell a streaming client the runner died; make any other client see a truncated body.

        Passing the runner's chunks through, the error event is a chunk of its
        own, and Twisted ends the body; a chunk cut in its middle cannot be ended.
        """
        if self.done.called or self._request.channel is None:
            return  # the client is gone, and the request with it
        self._request.unregisterProducer()
        Forwarder.log.warn("runner response cut short: {why}", why=why)
        if self._framed and between_chunks:
            self._request.chunked = True
        if self._events and (between_chunks or not self._framed):
            error = BadGateway(f"the runner stopped in the middle of the answer: {why}")
            self._request.write(b"data: " + json.dumps(error.body()).encode() + b"\n\n")
        else:
            self._request.channel.transport.abortConnection()  # type: ignore[union-attr]
        self.done.callback(None)
