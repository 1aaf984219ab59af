"""The one way every API's request goes to a runner over its UNIX socket, and its answer back.

This plays the role of twisted.web's C{ReverseProxyResource}, which speaks
HTTP/1.0 over TCP, buffers nothing but has no backpressure, and ignores client
disconnects. Here the runner's transport is registered as the client request's
producer (L{relay}), a client that goes away aborts the upstream connection (so
llama-server stops generating), and nothing is buffered. The runner side is
mrunner's own HTTP/1.1 client (L{pool}): a chunked answer goes to an HTTP/1.1
client with its framing as the runner wrote it.

OpenAI's answers pass through as the runner wrote them. The other APIs give a
L{Transform}: what they make of the runner's answer (Anthropic's relays it with
its own errors, Ollama's and the Responses API's translate it, OpenAI's audio
routes give whisper-server's text OpenAI's shape), after a refusal has been
raised in the API's own shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar, overload

from twisted.internet.defer import CancelledError, Deferred
from twisted.web.http_headers import Headers
from twisted.web.server import Request

from mrunner.errors import CacheFull, ContextExceeded
from mrunner.proxy.answer import Answer, refusal
from mrunner.proxy.fastrelay import FastRelay
from mrunner.proxy.pool import RunnerPool
from mrunner.proxy.relay import ErrorEvent, Observer, Relay, is_event_stream, start_event_stream
from mrunner.proxy.rename import Renaming
from mrunner.proxy.wire import CHUNKED, Head

T = TypeVar("T")

#: What an API makes of a runner's successful answer (its body is the transform's to take, at once).
Transform = Callable[[Answer], Awaitable[T]]

#: What a turn's body becomes for the block's duration (the prompt cache's slot, L{mrunner.cache.turns}):
#: called with the request, the runner's socket, the path, the body and its conversation if known.
Turns = Callable[[Request, str, bytes, bytes, tuple[object, ...]], AbstractAsyncContextManager[bytes]]


@asynccontextmanager
async def as_sent(
    request: Request, socket: str, path: bytes, body: bytes, known: tuple[object, ...]
) -> AsyncIterator[bytes]:
    """No prompt cache: the body goes as it is."""
    yield body


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
# twisted.web writes its own Server and Date: a runner's (whisper-server's "whisper.cpp", llama-server's
# "llama.cpp") made a second Server field in every answer (issue 53 N6).
DAEMON_WRITES = frozenset({b"server", b"date"})
NOT_RELAYED = HOP_BY_HOP | RUNNER_CORS | DAEMON_CREDENTIALS | DAEMON_WRITES


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

    C{error_event} is OpenAI's error in a server-sent event, for a stream the runner stops;
    C{turns}, the slot a request's body names while it is served (the prompt cache's). With
    C{fast} (C{[http] relay = "fast"}), a chunked answer passed through unchanged is moved by its
    thread (L{FastRelay}) where both sockets allow it.
    """

    def __init__(
        self, pool: RunnerPool, error_event: ErrorEvent, turns: Turns = as_sent, fast: FastRelay | None = None
    ):
        self._pool = pool
        self._error_event = error_event
        self._turns = turns
        self.fast = fast

    @overload
    async def forward(
        self,
        request: Request,
        socket: str,
        path: bytes,
        body: bytes,
        observer: Observer | None = None,
        renaming: Renaming | None = None,
        *,
        conversation: tuple[object, ...] = (),
    ) -> None: ...

    @overload
    async def forward(
        self,
        request: Request,
        socket: str,
        path: bytes,
        body: bytes,
        observer: Observer | None = None,
        renaming: Renaming | None = None,
        *,
        transform: Transform[T],
        conversation: tuple[object, ...] = (),
        content_type: bytes = b"application/json",
    ) -> T: ...

    async def forward(
        self,
        request: Request,
        socket: str,
        path: bytes,
        body: bytes,
        observer: Observer | None = None,
        renaming: Renaming | None = None,
        *,
        transform: Transform[T] | None = None,
        conversation: tuple[object, ...] = (),
        content_type: bytes = b"application/json",
    ) -> T | None:
        """Send C{body} for C{path} to the runner at C{socket}; returns when the answer is sent.

        Without a C{transform} (OpenAI's), the request goes with its client's
        headers and the answer passes through: its status, fields and body as
        the runner sent them, but for a refusal of a conversation longer than the
        runner's context, raised as L{ContextExceeded}, which says so plainly. A
        C{renaming} gives it the model name the request asked for (L{Renamed}): its
        length is then unknown, and the runner's framing is not kept.

        With a C{transform}, the request goes as JSON (or C{content_type}: the
        audio routes' form), a refusal is raised (L{refusal}) for the API to
        render in its shape, and the transform's result is returned; a renaming
        is the transform's (L{relayed}).

        C{observer} (the key's meter) sees the runner's answer body however it is
        taken (L{Answer.observer}); the request's record sees what its client is
        sent (L{record_writes}). C{conversation}, where the caller has read it from
        the body already, spares the prompt cache reading it again. Cancelling the
        Deferred that awaits it (Klein does, when the client disconnects) aborts the
        upstream connection.
        """
        async with self._turns(request, socket, path, body, conversation) as sent:
            if transform is None:
                await self._pass_through(request, socket, path, sent, observer, renaming)
                return None
            headers = Headers({b"content-type": [content_type]})
            answer = await self._send(request, socket, path, headers, sent, observer)
            if answer.code >= 400:
                raise refusal(answer.code, await answer.read())
            return await transform(answer)

    async def _pass_through(
        self,
        request: Request,
        socket: str,
        path: bytes,
        body: bytes,
        observer: Observer | None,
        renaming: Renaming | None,
    ) -> None:
        """OpenAI's forwarding: the answer as the runner sent it (L{forward})."""
        forwarded = forwarded_headers(request.requestHeaders)
        answer = await self._send(request, socket, path, forwarded, body, observer)
        if answer.code >= 400 and request.startedWriting:  # a wait's notes began the stream
            raise refusal(answer.code, await answer.read())
        refused = await _refused(answer) if answer.code in (400, 500) else None
        head = answer.head
        request.setResponseCode(head.code, head.phrase)
        headers = request.responseHeaders
        for name, value in answer_fields(head):
            headers.addRawHeader(name, value)
        if head.length >= 0 and renaming is None:
            headers.setRawHeaders(b"content-length", [b"%d" % head.length])
        if refused is not None:
            request.write(refused)
            return
        events = is_event_stream(head.value(b"content-type") or b"")
        if events:
            start_event_stream(request)
        # An HTTP/1.1 client takes the runner's chunks as they are: Twisted sends the
        # headers saying chunked (unless a wait's notes sent them already), and is then told
        # not to frame the body a second time.
        framed = head.framing == CHUNKED and renaming is None
        if framed:
            request.write(b"")
            framed, request.chunked = bool(request.chunked), False
        fast = self.fast if framed else None
        relayed = _relay(request, answer, framed, self._error_event if events else None, renaming, fast)
        del answer, head  # not kept for the minutes a stream may last (1,000 streams: 0.5 MB)
        await relayed

    async def _send(
        self,
        request: Request,
        socket: str,
        path: bytes,
        headers: Headers,
        body: bytes,
        observer: Observer | None,
    ) -> Answer:
        """The runner's answer, once its head is in (the pool resends after a race), shown to C{observer}.

        A client that went away meanwhile cancelled it, and that stays a
        cancellation, which Klein expects, rather than an error logged with
        its traceback, whatever the cancelled step raised (the pool's refused
        connect, say, when the cancel stopped the connecting).
        """
        try:
            answer: Answer = await self._pool.request(request.method, socket, path, headers, body)
        except Exception:
            if request.channel is None:
                raise CancelledError() from None
            raise
        answer.observer = observer
        return answer


def relayed(request: Request, error_event: ErrorEvent, renaming: Renaming | None = None) -> Transform[None]:
    """Anthropic's transform: the runner's status, content type and body to C{request} as they come.

    A runner that stops mid-answer is told with C{error_event}, whatever the content type.
    """

    def relay(answer: Answer) -> Deferred[None]:
        request.setResponseCode(answer.code)
        content_type = answer.content_type
        if content_type:
            request.setHeader(b"content-type", content_type)
        if is_event_stream(content_type):
            start_event_stream(request)
        return _relay(request, answer, False, error_event, renaming)

    return relay


def _relay(
    request: Request,
    answer: Answer,
    framed: bool,
    error_event: ErrorEvent | None,
    renaming: Renaming | None,
    fast: FastRelay | None = None,
) -> Deferred[None]:
    """Relay the answer's body to C{request} as it comes (L{Relay}), shown to its observer; fires at
    its end. The head is sent.

    With a C{renaming} (never C{framed}: the lengths change), the model's name is the one asked.
    With C{fast}, the thread moves what it can of the rest (L{FastRelay.take}).
    """
    relay = Relay(request, answer.connection, framed, error_event, answer.observer)
    answer.connection.relay(relay if renaming is None else renaming.around(relay), framed)
    if fast is not None and renaming is None:
        fast.take(relay, answer.connection)
    return relay.done


async def _refused(answer: Answer) -> bytes:
    """A runner's 400 or 500, a few hundred bytes, read whole; raised when it is L{ContextExceeded}
    or L{CacheFull} (L{refusal}), which mrunner tells in its own words."""
    body = await answer.read()
    error = refusal(answer.code, body)
    if isinstance(error, ContextExceeded | CacheFull):
        raise error
    return body
