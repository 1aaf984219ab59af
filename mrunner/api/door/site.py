"""The daemon's front door: twisted.web's Site with the trust rules applied before a body is read.

Left alone, twisted.web reads a whole request body (to a temporary file past
100 kB) before any resource sees the request, keeps a connection open as long
as a byte arrives now and then, and accepts as many connections as come. Here
each connection is a L{GatedChannel}, which asks L{Trust} as soon as a
request's headers are in; the site counts the connections, and one sweep a
fraction of C{header_timeout} apart cuts off those whose headers or body
trickle, and closes idle ones: the proxy path pays no timer per request for it.

A route may also take its body as it arrives (L{GatedSite}'s C{sinks}): an
import hashes and stores a model while it streams in, where the temporary
file would have it written, then read back and written again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource

from mrunner.api.door.channel import GatedChannel, GatedRequest, Sink
from mrunner.api.door.declared import Door
from mrunner.api.door.httptools_channel import HttptoolsChannel
from mrunner.api.door.trust import Trust, beyond_loopback, route_path
from mrunner.api.errors import Refusal
from mrunner.config import Config
from mrunner.daemon.logfiles import BatchedLogSite

ALLOWED_METHODS = b"GET, POST, DELETE, HEAD, OPTIONS"
PREFLIGHT_MAX_AGE = b"600"
# Sweeps per header_timeout: a trickler is cut off at most a quarter of it late.
SWEEPS_PER_TIMEOUT = 4
#: The channel for each C{[http] head_parser}: httptools' C parser, or twisted.web's own.
CHANNELS: dict[str, type[GatedChannel]] = {"httptools": HttptoolsChannel, "twisted": GatedChannel}


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
    requests from then on use them, and connections from then on its C{head_parser}.
    C{listen} and C{max_request_bytes} stay as the daemon started with them, as the
    routes and the listening port do, until a restart.

    C{sinks} maps a route's path to the L{Sink} that takes the bodies POSTed to it as they
    arrive. The body is still counted, limited and cut off when slow as any other; a sink is
    closed when the request ends or its connection is lost, and then removes what it wrote
    unless the route took it over.

    C{door}: what the routes declare of themselves for the front door; by default C{resource}'s
    own, when it is L{mrunner.api.door.routing.Routes}, else no route's.
    """

    protocol = GatedChannel  # type: ignore[assignment]
    events = Logger()  # (twisted.web's Site.log writes the access log)

    def __init__(
        self,
        resource: IResource,
        config: Config,
        reactor: Any,
        sinks: Mapping[bytes, Sink] | None = None,
        door: Door | None = None,
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
        self.door: Door = door if door is not None else getattr(resource, "door", Door())
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Use C{config}'s front-door rules for every request from now on."""
        config = attrs.evolve(
            config, listen=self._started.listen, max_request_bytes=self._started.max_request_bytes
        )
        self.trust = Trust(config, self.door)
        self.protocol = CHANNELS[config.http.head_parser]
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
            return Refusal(request.refusal, close=True, shaped=self.door.shaped)
        if request.cors_origin is not None and request.method == b"OPTIONS":
            return PREFLIGHT
        resource: IResource = super().getResourceFor(request)
        return resource


def private_listen(listen: str) -> str:
    """C{listen}, with a C{unix:} socket that only this user may open unless it names a C{mode}."""
    if listen.startswith("unix:") and ":mode=" not in listen:
        return listen + ":mode=600"
    return listen
