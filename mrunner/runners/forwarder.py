"""Forwards a request to a runner over its UNIX socket and streams the answer back.

This plays the role of twisted.web's C{ReverseProxyResource}, which speaks
HTTP/1.0 over TCP, buffers nothing but has no backpressure, and ignores client
disconnects. Here the runner's transport is registered as the client request's
producer (L{relay}), a client that goes away aborts the upstream connection (so
llama-server stops generating), and nothing is buffered. The runner side is
mrunner's own HTTP/1.1 client (L{pool}): a chunked answer goes to an HTTP/1.1
client with its framing as the runner wrote it.
"""

from __future__ import annotations

from collections.abc import Iterator

from twisted.internet.defer import CancelledError
from twisted.web.http_headers import Headers
from twisted.web.server import Request

from mrunner.errors import ContextExceeded
from mrunner.runners.answer import Answer
from mrunner.runners.pool import RunnerPool
from mrunner.runners.relay import ErrorEvent, Observer, is_event_stream, start_event_stream
from mrunner.runners.rename import Renaming
from mrunner.runners.wire import CHUNKED, Head

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


class Forwarder:
    """Sends requests to runners through one pool of keep-alive connections (L{RunnerPool}).

    C{error_event} is the API's error in a server-sent event, for a stream the runner stops.
    """

    def __init__(self, pool: RunnerPool, error_event: ErrorEvent):
        self._pool = pool
        self._error_event = error_event

    async def forward(
        self,
        request: Request,
        socket: str,
        path: bytes,
        body: bytes,
        observer: Observer | None = None,
        renaming: Renaming | None = None,
    ) -> None:
        """Relay C{request} (whose body is C{body}) to the runner; returns when the answer is sent.

        A 400 is read whole first: llama-server's refusal of a conversation longer
        than its context becomes L{ContextExceeded}, which says so plainly.

        Cancelling the Deferred that awaits it (Klein does, when the client
        disconnects) aborts the upstream connection. An C{observer} sees the
        answer's body as it goes to the client. A C{renaming} gives the answer the
        model name the request asked for (L{Renamed}): its length is then unknown,
        and the runner's framing is not kept.
        """
        answer = await self._send(request, socket, path, body)
        refusal = await _refusal(answer) if answer.code == 400 else None
        head = answer.head
        request.setResponseCode(head.code, head.phrase)
        headers = request.responseHeaders
        for name, value in answer_fields(head):
            headers.addRawHeader(name, value)
        if head.length >= 0 and renaming is None:
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
        framed = head.framing == CHUNKED and request.clientproto == b"HTTP/1.1" and renaming is None
        if framed:
            request.write(b"")
            request.chunked = False
        if observer is not None:
            observer.start(framed)
        relayed = answer.pass_on(request, framed, self._error_event if events else None, observer, renaming)
        del answer, head  # not kept for the minutes a stream may last (1,000 streams: 0.5 MB)
        await relayed

    async def _send(self, request: Request, socket: str, path: bytes, body: bytes) -> Answer:
        """The runner's answer, once its head is in (the pool resends after a race).

        A client that went away meanwhile cancelled it, and that stays a
        cancellation, which Klein expects, rather than an error logged with
        its traceback, whatever the cancelled step raised (the pool's refused
        connect, say, when the cancel stopped the connecting).
        """
        try:
            answer: Answer = await self._pool.request(
                request.method, socket, path, forwarded_headers(request.requestHeaders), body
            )
        except Exception:
            if request.channel is None:
                raise CancelledError() from None
            raise
        return answer


async def _refusal(answer: Answer) -> bytes:
    """A runner's 400, a few hundred bytes, read whole: L{ContextExceeded} when it is the context."""
    body = await answer.read()
    exceeded = ContextExceeded.from_runner(body)
    if exceeded is not None:
        raise exceeded
    return body
