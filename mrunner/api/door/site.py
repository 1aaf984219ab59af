"""The daemon's front door: twisted.web's Site with the trust rules applied before a body is read.

Left alone, twisted.web reads a whole request body (to a temporary file past
100 kB) before any resource sees the request, keeps a connection open as long
as a byte arrives now and then, and accepts as many connections as come. Here
the channel asks L{Trust} as soon as a request's headers are in: a refused
request is answered at once and its body is never read. One sweep a fraction
of C{header_timeout} apart cuts off connections whose headers or body trickle,
and closes idle ones; the proxy path pays no timer per request for it.

What twisted.web's parser refuses by closing the connection without a word (a
request line or header past its 16 KiB, a malformed header or chunk) is
answered here with a status and a JSON error before the close: 414, 431 or
400. A request refused before its body is read is answered at once; what the
client still sends of it is read and dropped, not taken for a next request
(twisted.web would buffer it and stop reading, and the client, still
writing, would see a reset instead of the answer), and the connection is
half-closed so that a client reading to the end sees the answer end.

A connection whose client reads nothing of its answer for C{idle_timeout}
is closed: a follow stream or a long answer must not hold a connection,
and what is queued for it, for ever.

A route may also take its body as it arrives (L{GatedSite}'s C{sinks}): an
import hashes and stores a model while it streams in, where the temporary
file would have it written, then read back and written again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
from twisted.internet.address import UNIXAddress
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel, _ChunkedTransferDecoder, _MalformedChunkedDataError
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request

from mrunner.api.door.callers import OPEN, Caller
from mrunner.api.door.trust import Trust, beyond_loopback, route_path
from mrunner.api.errors import PHRASES, Refusal
from mrunner.config import Config
from mrunner.errors import (
    BadRequest,
    HeadersTooLarge,
    MethodNotAllowed,
    MrunnerError,
    PayloadTooLarge,
    Unavailable,
    UriTooLong,
)
from mrunner.logfiles import BatchedLogSite

ALLOWED_METHODS = b"GET, POST, DELETE, HEAD, OPTIONS"
# Methods any route takes (PUT reaches the compat APIs' catch-alls, which name what they serve).
# Methods are case-sensitive: ``post`` is no method of mrunner's, and is never forwarded.
SERVED_METHODS = frozenset((b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS"))
# A body of 2**63 bytes is past any limit: a Content-Length or chunk size beyond it is malformed.
MAX_LENGTH_DIGITS = len(str(2**63 - 1))
MAX_CHUNK_SIZE = 2**63 - 1
PREFLIGHT_MAX_AGE = b"600"
# Sweeps per header_timeout: a trickler is cut off at most a quarter of it late.
SWEEPS_PER_TIMEOUT = 4
# How much a socket read takes while a sink takes the body, instead of twisted's 64 KiB: each read
# costs the reactor the same Python (HTTP framing, the sink's call) whatever its size, and at
# 64 KiB that was an eighth of a 112 MB import's time.
SINK_READ_SIZE = 1024 * 1024


class Body(Protocol):
    """What twisted.web asks of a request's C{content}: the body is written to it as it arrives."""

    def write(self, data: bytes) -> object: ...
    def tell(self) -> int: ...
    def seek(self, offset: int, whence: int = 0) -> object: ...
    def close(self) -> object: ...


#: Makes the L{Body} a route's request body is written to, in place of twisted.web's temporary file.
Sink = Callable[[IRequest], Body]


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


class GatedChannel(HTTPChannel):
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
        super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        if self._lingering is not None:
            return  # refused: the rest of what was sent is not a next request
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._head_too_large()
            return
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

    def headerReceived(self, line: bytes) -> bool:
        if self._receivedHeaderCount >= self.maxHeaders:
            self._answer_and_close(HeadersTooLarge(f"the request has over {self.maxHeaders} headers"))
            return False
        return bool(super().headerReceived(line))

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:
        if header == b"Content-Length" and len(data) > MAX_LENGTH_DIGITS:
            # twisted.web would raise from int() past 4,300 digits and drop the connection unanswered.
            self._answer_and_close(
                BadRequest(
                    f"Content-Length has {len(data)} characters; no body is that long", code="bad_length"
                )
            )
            return False
        chosen = bool(super()._maybeChooseTransferDecoder(header, data))
        if chosen and type(self._transferDecoder) is _ChunkedTransferDecoder:
            self._transferDecoder = SizedChunks(self.requests[-1].handleContentChunk, self._finishRequestBody)
        return chosen

    def rawDataReceived(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # a refused body: buffered as a next request, it would stop the reading
        if self._handlingRequest:
            super().rawDataReceived(data)
            return
        decoder: Any = self._transferDecoder  # set while a body is read
        try:
            decoder.dataReceived(data)
        except _MalformedChunkedDataError as e:
            self._answer_and_close(
                BadRequest(f"the request's chunked body is malformed: {e}", code="bad_chunk")
            )

    def _respondToBadRequestAndDisconnect(self) -> None:
        """What twisted.web does for a request it cannot parse: here with a JSON body saying so."""
        self._answer_and_close(
            BadRequest("the request is not valid HTTP/1.1 (its request line or a header is malformed)")
        )

    def _answer_and_close(self, error: MrunnerError) -> None:
        """Answer a request that cannot be read with C{error}, before any route sees it, then close."""
        self.transport.write(raw_answer(error))
        self._linger()

    def _linger(self) -> None:
        """Close after the answer, once the client is done sending, or after C{header_timeout}.

        What the client still sends meanwhile is read and dropped, so that a client still
        sending the refused request sees the answer rather than a reset connection.
        """
        self.persistent = False
        self._lingering = self.site.reactor.seconds()
        half_close = getattr(self.transport, "loseWriteConnection", None)  # TCP and UNIX, not TLS
        if half_close is not None:
            half_close()

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
        self._head_lines = 0
        request: GatedRequest = self.requests[-1]
        trust: Trust = self.site.trust
        try:
            if self._command not in SERVED_METHODS:
                raise unserved_method(self._command)
            if self.over_cap and route_path(self._path).rstrip(b"/") != b"/health":
                raise Unavailable(
                    f"mrunner is serving its limit of {trust.http.max_connections} connections"
                    " ([http] max_connections); try again shortly",
                    retry_after=1,
                )
            headers = request.requestHeaders
            request.cors_origin = trust.origin(headers, self._via_socket)
            request.caller = trust.check_key(self._command, self._path, headers, request.cors_origin)
            if self.length != 0:
                limit = trust.body_limit(self._path, self.length)
                if self.length is None:
                    request.chunked_allowance = limit
        except MrunnerError as error:
            self._refuse(request, error)
            self.length = 0  # answered now: the body, if any, is never read
            request.gotLength(0)
            return
        if self.length != 0:
            self._body_mark = (self.site.reactor.seconds(), self._received)
            if self._command == b"POST":
                request.sink = self.site.sink(self._path)
                # A TCP or UNIX socket's transport says how much it reads (TLS reads its own way).
                if request.sink is not None and hasattr(self.transport, "bufferSize"):
                    self._read_size = self.transport.bufferSize
                    self.transport.bufferSize = SINK_READ_SIZE
        super().allHeadersReceived()
        if self.over_cap:  # /health, answered past the cap: then the connection closes
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


class SizedChunks(_ChunkedTransferDecoder):
    """twisted.web's reader of a chunked body, refusing a chunk size no body can have (it takes any)."""

    def _dataReceived_CHUNK_LENGTH(self) -> bool:
        read = bool(super()._dataReceived_CHUNK_LENGTH())
        if read and self.length > MAX_CHUNK_SIZE:
            raise _MalformedChunkedDataError(
                f"a chunk size of {len(f'{self.length:x}')} hex digits is past 2**63"
            )
        return read


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


def unserved_method(method: bytes) -> MethodNotAllowed:
    """The refusal of a method no route takes, C{post} (lower case) among them."""
    error = MethodNotAllowed(
        f"{method.decode('ascii', errors='replace')!r} is not a method mrunner serves (methods are"
        f" case-sensitive): {b', '.join(sorted(SERVED_METHODS)).decode()}",
        code="method_not_allowed",
    )
    error.headers = ((b"allow", b", ".join(sorted(SERVED_METHODS))),)
    return error


class Preflight(Resource):
    """A browser's CORS preflight from an allowed origin: 204 and what it may send."""

    isLeaf = True

    def render(self, request: IRequest) -> bytes:
        request.setHeader(b"access-control-allow-methods", ALLOWED_METHODS)
        requested = request.getHeader(b"access-control-request-headers")
        if requested:
            request.setHeader(b"access-control-allow-headers", requested)
        if request.getHeader(b"access-control-request-private-network") == b"true":
            request.setHeader(b"access-control-allow-private-network", b"true")
        request.setHeader(b"access-control-max-age", PREFLIGHT_MAX_AGE)
        request.setResponseCode(204)
        return b""


PREFLIGHT = Preflight()


class GatedSite(BatchedLogSite):
    """The HTTP server: counts its connections and sweeps them; its trust rules can be replaced.

    C{configure(config)} swaps in the C{[http]} settings of a newly read configuration:
    requests from then on use them. C{listen} and C{max_request_bytes} stay as the daemon
    started with them, as the routes and the listening port do, until a restart.

    C{sinks} maps a route's path to the L{Sink} that takes the bodies POSTed to it as they
    arrive. The body is still counted, limited and cut off when slow as any other; a sink is
    closed when the request ends or its connection is lost, and then removes what it wrote
    unless the route took it over.
    """

    protocol = GatedChannel  # type: ignore[assignment]
    events = Logger()  # (twisted.web's Site.log writes the access log)

    def __init__(
        self, resource: IResource, config: Config, reactor: Any, sinks: Mapping[bytes, Sink] | None = None
    ):
        # Twisted's own idle timeout is off: the sweep closes idle connections instead. No route
        # takes an HTML form, and parsing one means an email.message.EmailMessage per POST to
        # read its Content-Type: 14% of the daemon's CPU on small chats (py-spy).
        super().__init__(
            resource, reactor, requestFactory=GatedRequest, timeout=None, parsePOSTFormSubmission=False
        )
        self.displayTracebacks = False
        self._channels: set[GatedChannel] = set()
        self._sweeper = LoopingCall(self._sweep)
        self._sweeper.clock = reactor
        self._started = config
        self._sinks = dict(sinks or {})
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Use C{config}'s front-door rules for every request from now on."""
        config = attrs.evolve(
            config, listen=self._started.listen, max_request_bytes=self._started.max_request_bytes
        )
        self.trust = Trust(config)
        if beyond_loopback(config.listen) and not (config.http.api_keys or config.http.admin_api_keys):
            self.events.warn(
                "listening on {listen} without [http] api_keys: whoever reaches it may use every route",
                listen=config.listen,
            )
        if self._sweeper.running:
            self._sweeper.stop()
            self._start_sweeping()

    def sink(self, target: bytes) -> Sink | None:
        """What takes the body POSTed to C{target} as it arrives, if its route has a sink."""
        return self._sinks.get(route_path(target).rstrip(b"/")) if self._sinks else None

    def _start_sweeping(self) -> None:
        self._sweeper.start(self.trust.http.header_timeout / SWEEPS_PER_TIMEOUT, now=False)

    def startFactory(self) -> None:
        super().startFactory()
        self._start_sweeping()

    def stopFactory(self) -> None:
        super().stopFactory()
        if self._sweeper.running:
            self._sweeper.stop()

    def buildProtocol(self, addr: Any) -> Any:
        channel: GatedChannel = super().buildProtocol(addr)
        channel.over_cap = len(self._channels) >= self.trust.http.max_connections
        self._channels.add(channel)
        return channel

    def forget(self, channel: GatedChannel) -> None:
        self._channels.discard(channel)

    @property
    def connections(self) -> int:
        """Connections open now, those being refused for the cap included."""
        return len(self._channels)

    def _sweep(self) -> None:
        now = self.reactor.seconds()
        for channel in list(self._channels):
            channel.sweep(now, self.trust)

    def getResourceFor(self, request: GatedRequest) -> IResource:
        if request.cors_origin is not None:
            request.setHeader(b"access-control-allow-origin", request.cors_origin)
            request.setHeader(b"vary", b"Origin")
        if request.refusal is not None:
            return Refusal(request.refusal, close=True)
        if request.cors_origin is not None and request.method == b"OPTIONS":
            return PREFLIGHT
        resource: IResource = super().getResourceFor(request)
        return resource


def private_listen(listen: str) -> str:
    """C{listen}, with a C{unix:} socket that only this user may open unless it names a C{mode}."""
    if listen.startswith("unix:") and ":mode=" not in listen:
        return listen + ":mode=600"
    return listen
