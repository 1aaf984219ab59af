"""The front door's connection: each request's headers checked before its body is read.

The channel asks L{Trust} as soon as a request's headers are in: a refused
request is answered at once and its body is never read. What twisted.web's
parser refuses by closing the connection without a word (a request line or
header past its 16 KiB, a malformed header or chunk) is answered here with a
status and a JSON error before the close: 414, 431 or 400. A head with a line
ended by LF alone is a 400 at once: twisted.web's parser waits for a CRLF that
never comes, and the client, waiting too, saw a reset 10 s later (RFC 9112 lets
a server take LF alone as a line end; a node that routers forward to refuses it
rather than read a head otherwise than the router before it). A request refused
before its body is read is answered at once; what the client still sends of it
is read and dropped, not taken for a next request (twisted.web would buffer it
and stop reading, and the client, still writing, would see a reset instead of
the answer), and the connection is half-closed so that a client reading to the
end sees the answer end.

Each sweep of L{GatedSite} asks every channel whether its client trickles
headers or a body, or reads nothing of its answer for C{idle_timeout}: a
follow stream or a long answer must not hold a connection, and what is queued
for it, for ever.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.address import UNIXAddress
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.door.callers import OPEN, Caller
from mrunner.api.door.trust import Trust, route_path
from mrunner.api.door.webprivate import PrivateChannel
from mrunner.api.errors import PHRASES
from mrunner.errors import (
    BadRequest,
    HeadersTooLarge,
    MethodNotAllowed,
    MrunnerError,
    PayloadTooLarge,
    Unavailable,
    UriTooLong,
)

if TYPE_CHECKING:
    from mrunner.api.door.site import GatedSite

# Methods any route takes (PUT reaches the compat APIs' catch-alls, which name what they serve).
# Methods are case-sensitive: ``post`` is no method of mrunner's, and is never forwarded.
SERVED_METHODS = frozenset((b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS"))
# A body of 2**63 bytes is past any limit: a Content-Length beyond it is malformed.
MAX_LENGTH_DIGITS = len(str(2**63 - 1))
# What the routes declare is still answered at the connection cap (the health probe), then closed.
# How much a socket read takes while a sink takes the body, instead of twisted's 64 KiB: each read
# costs the reactor the same Python (HTTP framing, the sink's call) whatever its size, and at
# 64 KiB that was an eighth of a 112 MB import's time.
SINK_READ_SIZE = 1024 * 1024


class RequestBody(Protocol):
    """What twisted.web asks of a request's C{content}: the body is written to it as it arrives."""

    def write(self, data: bytes) -> object: ...
    def tell(self) -> int: ...
    def seek(self, offset: int, whence: int = 0) -> object: ...
    def close(self) -> object: ...


#: Makes the L{RequestBody} a route's request body is written to, in place of twisted.web's temporary file.
Sink = Callable[[IRequest], RequestBody]


class GatedRequest(Request):
    """A request that may have been refused before its body was read, or allowed a browser origin."""

    refusal: MrunnerError | None = None
    cors_origin: bytes | None = None
    caller: Caller = OPEN
    # Bytes a chunked body may still bring; a declared length is checked once, up front.
    chunked_allowance: int | None = None
    # What takes the body instead of twisted.web's temporary file, for the routes that asked.
    sink: Sink | None = None

    def gotLength(self, length: int | None) -> None:
        if self.sink is None:
            super().gotLength(length)
        else:
            self.content = self.sink(self)

    def handleContentChunk(self, data: bytes) -> None:
        if self.chunked_allowance is not None:
            self.chunked_allowance -= len(data)
            if self.chunked_allowance < 0:
                self.chunked_allowance = None
                channel: GatedChannel = self.channel  # type: ignore[assignment]
                channel.refuse_now(self, PayloadTooLarge("request body is over this route's limit"))
        if self.refusal is None:
            super().handleContentChunk(data)


class GatedChannel(PrivateChannel):
    """An HTTP/1.1 connection that checks each request's headers before reading its body."""

    log = Logger()
    over_cap = False
    site: GatedSite
    transport: Any  # a TCP, UNIX or TLS transport: abortConnection, getHost, getPeer

    def __init__(self) -> None:
        super().__init__()
        self._received = 0
        self._awaiting = True  # waiting for a request's headers
        self._since: float | None = None  # when the pending request's first bytes came
        self._idle_since = 0.0
        self._body_mark: tuple[float, int] | None = None  # (when, bytes received) in a body
        self._lingering: float | None = None  # since when a refused request's body is discarded
        self._via_socket = False
        self._read_size: int | None = None  # the transport's own, while it reads for a sink
        self._head_lines = 0  # lines of the pending request's head read so far
        self._head_bytes = 0  # and their bytes, as twisted.web counts them against totalHeadersSize
        self._stalled_since: float | None = None  # since when the client reads nothing of its answer

    def connectionMade(self) -> None:
        super().connectionMade()
        self._via_socket = isinstance(self.transport.getHost(), UNIXAddress)
        self._idle_since = self.site.reactor.seconds()

    def dataReceived(self, data: bytes) -> None:
        if self._lingering is not None:
            return
        self._received += len(data)
        if self._awaiting and self._since is None:
            self._since = self.site.reactor.seconds()
        self._receive(data)

    def _receive(self, data: bytes) -> None:
        """Parse C{data}: here with twisted.web's parser, a line of the head at a time."""
        super().dataReceived(data)
        self._refuse_bare_lf()

    def _refuse_bare_lf(self) -> None:
        """Answer 400 now if the head twisted.web's parser holds, unended, has a line ended by LF alone.

        Read through a whole read, in line mode and not paused, the parser holds only a line
        without its CRLF: an LF in it is a bare one.
        """
        if self.unended_line() and not self.transport.disconnecting:
            self._answer_and_close(bare_lf())

    def lineReceived(self, line: bytes) -> None:
        if self._lingering is not None:
            return  # refused: the rest of what was sent is not a next request
        if b"\n" in line:
            self._answer_and_close(bare_lf())
            return
        size = self._head_bytes + len(line)
        if size > self.totalHeadersSize:
            self._head_too_large()
            return
        self._head_bytes = size
        self._head_lines += 1
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        self._head_too_large()

    def _head_too_large(self) -> None:
        if self._head_lines == 0:
            self._answer_and_close(UriTooLong(f"the request line is over {self.MAX_LENGTH} bytes"))
        else:
            self._answer_and_close(
                HeadersTooLarge(f"the request's headers are over {self.totalHeadersSize} bytes")
            )

    def too_many_headers(self) -> None:
        self._answer_and_close(HeadersTooLarge(f"the request has over {self.maxHeaders} headers"))

    def content_length(self, data: bytes) -> bool:
        if len(data) > MAX_LENGTH_DIGITS:
            # twisted.web would raise from int() past 4,300 digits and drop the connection unanswered.
            self._answer_and_close(
                BadRequest(
                    f"Content-Length has {len(data)} characters; no body is that long", code="bad_length"
                )
            )
            return False
        return True

    def rawDataReceived(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # a refused body: buffered as a next request, it would stop the reading
        super().rawDataReceived(data)

    def malformed(self, why: str | None) -> None:
        """What twisted.web does for a request it cannot parse: here with a JSON body saying so."""
        if why is None:
            error = BadRequest(
                "the request is not valid HTTP/1.1 (its request line or a header is malformed)"
            )
        else:
            error = BadRequest(f"the request's chunked body is malformed: {why}", code="bad_chunk")
        self._answer_and_close(error)

    def _answer_and_close(self, error: MrunnerError) -> None:
        """Answer a request that cannot be read with C{error}, before any route sees it, then close.

        Once: the lines after a refused one, read from the same buffer, are dropped unanswered.
        """
        if self._lingering is not None:
            return
        self.transport.write(raw_answer(error))
        self._linger()

    def _linger(self) -> None:
        """Close after the answer, once the client is done sending, or after C{header_timeout}.

        What the client still sends meanwhile is read and dropped, so that a client still
        sending the refused request sees the answer rather than a reset connection.
        """
        self.persistent = False
        self._lingering = self.site.reactor.seconds()
        # TCP and UNIX only, so asked of the transport's class: TLS's wrapper hands unknown names to
        # the TCP transport under it, which would half-close the socket under TLS's own close.
        if hasattr(type(self.transport), "loseWriteConnection"):
            self.transport.loseWriteConnection()

    def pauseProducing(self) -> None:
        if self._stalled_since is None:
            self._stalled_since = self.site.reactor.seconds()
        super().pauseProducing()

    def resumeProducing(self) -> None:
        self._stalled_since = None
        super().resumeProducing()

    def allHeadersReceived(self) -> None:
        self._awaiting = False
        self._since = None
        self._head_lines = self._head_bytes = 0
        request: GatedRequest = self.requests[-1]
        trust: Trust = self.site.trust
        command, target = self.command, self.target
        try:
            if command not in SERVED_METHODS:
                raise unserved_method(command)
            if self.over_cap and route_path(target).rstrip(b"/") not in trust.door.past_cap:
                raise Unavailable(
                    f"mrunner is serving its limit of {trust.http.max_connections} connections"
                    " ([http] max_connections); try again shortly",
                    retry_after=1,
                )
            headers = request.requestHeaders
            request.cors_origin = trust.origin(headers, self._via_socket)
            request.caller = trust.check_key(command, target, headers, request.cors_origin)
            if self.length != 0:
                limit = trust.body_limit(target, self.length)
                if self.length is None:
                    request.chunked_allowance = limit
        except MrunnerError as error:
            self._refuse(request, error)
            self.length = 0  # answered now: the body, if any, is never read
            request.gotLength(0)
            return
        if self.length != 0:
            self._body_mark = (self.site.reactor.seconds(), self._received)
            if command == b"POST":
                request.sink = self.site.sink(target)
                # A TCP or UNIX socket's transport says how much it reads (TLS reads its own way).
                if request.sink is not None and hasattr(self.transport, "bufferSize"):
                    self._read_size = self.transport.bufferSize
                    self.transport.bufferSize = SINK_READ_SIZE
        super().allHeadersReceived()
        if self.over_cap:  # a route declared past_cap (the health probe): then the connection closes
            self.persistent = False
            request.setHeader(b"connection", b"close")

    def _refuse(self, request: GatedRequest, error: MrunnerError) -> None:
        request.refusal = error
        self.persistent = False

    def refuse_now(self, request: GatedRequest, error: MrunnerError) -> None:
        """Answer C{request} with C{error} in the middle of its body, and read no more of it."""
        self._refuse(request, error)
        self.allContentReceived()

    def allContentReceived(self) -> None:
        if self._lingering is not None:
            return  # the body of a request refused midway has ended: it was answered already
        self._body_mark = None
        if self._read_size is not None:
            self.transport.bufferSize, self._read_size = self._read_size, None
        super().allContentReceived()

    def requestDone(self, request: GatedRequest) -> None:
        if request.refusal is not None:
            # Read and drop what the client still sends for a while, so that a client still
            # sending the refused body sees the answer rather than a reset connection.
            self.requests.remove(request)
            self._linger()
            return
        self._awaiting = True
        self._idle_since = self.site.reactor.seconds()
        super().requestDone(request)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self.site.forget(self)
        super().connectionLost(reason)

    def sweep(self, now: float, trust: Trust) -> None:
        """Close this connection if it is too slow, idle too long, or done lingering."""
        http = trust.http
        if self._lingering is not None:
            if now - self._lingering >= http.header_timeout:
                self.transport.abortConnection()
        elif self._stalled_since is not None and now - self._stalled_since > http.idle_timeout:
            self._cut_off("its client read nothing of its answer for {seconds}s", seconds=http.idle_timeout)
        elif self._since is not None:
            if now - self._since > http.header_timeout:
                self._cut_off("its request headers took over {seconds}s", seconds=http.header_timeout)
        elif self._body_mark is not None:
            when, received = self._body_mark
            if now - when >= http.header_timeout:
                if self._received - received < http.min_body_rate * (now - when):
                    self._cut_off("its request body came slower than {rate} bytes/s", rate=http.min_body_rate)
                self._body_mark = (now, self._received)
        elif self._awaiting and now - self._idle_since > http.idle_timeout:
            self.loseConnection()

    def _cut_off(self, why: str, **limit: float) -> None:
        self.log.info("cut off {peer}: " + why, peer=str(self.transport.getPeer()), **limit)
        self.transport.abortConnection()


def raw_answer(error: MrunnerError) -> bytes:
    """A whole response for C{error}, in OpenAI's shape, for a request no route will see; it closes."""
    body = json.dumps(error.body()).encode() + b"\n"
    head = [
        b"HTTP/1.1 %d %s" % (error.status, PHRASES[error.status]),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
        *(name + b": " + value for name, value in error.headers),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def bare_lf() -> BadRequest:
    """The refusal of a head with a line ended by LF alone."""
    return BadRequest(
        "the request's head has a line ended by LF alone; HTTP/1.1 ends each line with CRLF (\\r\\n)",
        code="bare_lf",
    )


def unserved_method(method: bytes) -> MethodNotAllowed:
    """The refusal of a method no route takes, C{post} (lower case) among them."""
    error = MethodNotAllowed(
        f"{method.decode('ascii', errors='replace')!r} is not a method mrunner serves (methods are"
        f" case-sensitive): {b', '.join(sorted(SERVED_METHODS)).decode()}",
        code="method_not_allowed",
    )
    error.headers = ((b"allow", b", ".join(sorted(SERVED_METHODS))),)
    return error
