"""The forwarder: what a client gets of a runner's answer, by its HTTP version and when the runner stops."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import UNIXServerEndpoint
from twisted.internet.interfaces import ITCPTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.http import HTTPChannel, Request
from twisted.web.test.requesthelper import DummyRequest
from zope.interface import implementer

from mrunner.errors import MrunnerError
from mrunner.proxy.fastrelay import FastRelay
from mrunner.proxy.forwarder import Forwarder
from mrunner.proxy.pool import RunnerPool, unix_connect
from mrunner.proxy.relay import start_event_stream
from tests.unit.proxy.fakes import CHUNKED_HEAD, CHUNKS, EVENTS, Connections, client_request, runner_sends


def error_event(error: MrunnerError) -> bytes:
    return b"data: " + error.message.encode() + b"\n\n"


CUT = b"data: the runner stopped in the middle of the answer: its connection closed\n\n"


@implementer(ITCPTransport)
class TCPTransport(StringTransport):
    """A client connection that records whether Nagle's algorithm was turned off."""

    no_delay = False

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


class EventStreamTests(SynchronousTestCase):
    def request(self, transport: StringTransport) -> Request:
        channel = HTTPChannel()
        channel.makeConnection(transport)
        request = Request(channel)
        request.method, request.clientproto = b"POST", b"HTTP/1.1"
        request.responseHeaders.setRawHeaders(b"content-type", [b"text/event-stream"])
        return request

    def test_headers_go_out_before_the_first_event(self) -> None:
        transport = TCPTransport()
        start_event_stream(self.request(transport))
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertTrue(transport.value().endswith(b"\r\n\r\n"))
        self.assertTrue(transport.no_delay)

    def test_a_connection_without_nagle_is_fine(self) -> None:
        transport = StringTransport()
        start_event_stream(self.request(transport))
        self.assertIn(b"text/event-stream", transport.value())


class ForwardingTests(SynchronousTestCase):
    """What a client gets, by its HTTP version, when the runner answers, in chunks or not, or stops."""

    fast: FastRelay | None = None

    def forward(self, version: bytes, *data: bytes, cut: bool = False) -> tuple[bytes, StringTransport]:
        connections = Connections()
        pool = RunnerPool(Clock(), connections, per_socket=2)
        request, client = client_request(version)
        forwarder = Forwarder(pool, error_event, fast=self.fast)
        forwarding = Deferred.fromCoroutine(forwarder.forward(request, "/run/r.sock", b"/v1/x", b"{}"))
        runner_sends(connections.made[0][0], data, cut)
        self.successResultOf(forwarding)
        if not client.disconnecting:
            request.finish()
        if self.fast is not None:
            self.assertEqual(self.fast.moved, 0, "the fast relay declined")
        return client.value(), client

    def test_an_http11_client_gets_the_runners_chunks(self) -> None:
        data, _ = self.forward(b"HTTP/1.1", CHUNKED_HEAD + CHUNKS[:20], CHUNKS[20:])
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertIn(b"Transfer-Encoding: chunked", head)
        self.assertEqual(body, CHUNKS)

    def test_an_http10_client_gets_the_events_alone(self) -> None:
        data, _ = self.forward(b"HTTP/1.0", CHUNKED_HEAD + CHUNKS[:20], CHUNKS[20:])
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertNotIn(b"chunked", head)
        self.assertEqual(body, b"".join(EVENTS))

    def test_a_stream_cut_between_chunks_ends_with_the_apis_error_event(self) -> None:
        first = CHUNKS.index(b"\r\n", CHUNKS.index(b"\r\n") + 2) + 2
        data, client = self.forward(b"HTTP/1.1", CHUNKED_HEAD + CHUNKS[:first], cut=True)
        body = data.partition(b"\r\n\r\n")[2]
        self.assertEqual(body, CHUNKS[:first] + b"%x\r\n%s\r\n0\r\n\r\n" % (len(CUT), CUT))
        self.assertFalse(client.disconnecting)

    def test_a_stream_cut_inside_a_chunk_cuts_the_client_off(self) -> None:
        data, client = self.forward(b"HTTP/1.1", CHUNKED_HEAD + CHUNKS[:10], cut=True)
        self.assertEqual(data.partition(b"\r\n\r\n")[2], CHUNKS[:10])
        self.assertTrue(client.disconnecting)

    def test_a_stream_to_an_http10_client_ends_with_the_error_event(self) -> None:
        data, _ = self.forward(b"HTTP/1.0", CHUNKED_HEAD + CHUNKS[:10], cut=True)
        self.assertEqual(data.partition(b"\r\n\r\n")[2], CHUNKS[3:10] + CUT)

    def test_the_runners_server_and_date_are_not_relayed(self) -> None:
        """twisted.web writes its own: the runner's made a second Server field (issue 53 N6)."""
        head = b"HTTP/1.1 200 OK\r\nServer: whisper.cpp\r\nDate: then\r\nContent-Length: 2\r\n\r\n"
        data, _ = self.forward(b"HTTP/1.1", head + b"{}")
        self.assertNotIn(b"whisper.cpp", data)
        self.assertNotIn(b"then", data)
        self.assertTrue(data.endswith(b"\r\n\r\n{}"))

    def test_a_body_not_of_events_cut_short_cuts_the_client_off(self) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n"
        data, client = self.forward(b"HTTP/1.1", head + b"{}   ", cut=True)
        self.assertEqual(data.partition(b"\r\n\r\n")[2], b"{}   ")
        self.assertTrue(client.disconnecting)


class FallbackTests(ForwardingTests):
    """With C{[http] relay = "fast"}, sockets the thread cannot take (a TLS client's; here
    StringTransports) are served by the Twisted relay, byte for byte as without it."""

    def setUp(self) -> None:
        self.fast = FastRelay(MemoryReactor(), unused_mover)


def unused_mover(*made: object) -> object:
    raise AssertionError("no stream here is one the thread can take")


class Silent(Protocol):
    """A runner that reads a request and never answers; C{asked} fires with the first bytes."""

    def __init__(self, asked: Deferred[bytes]):
        self._asked = asked

    def dataReceived(self, data: bytes) -> None:
        if not self._asked.called:
            self._asked.callback(data)


class CancelTests(TestCase):
    """A client gone while the runner is asked is a cancellation at any step (real pool, real socket)."""

    async def setUp(self) -> None:  # type: ignore[override]
        run = Path(tempfile.mkdtemp(prefix="mr-"))
        self.addCleanup(shutil.rmtree, run, True)
        self.socket = str(run / "r.sock")
        self.asked: Deferred[bytes] = Deferred()
        port = await UNIXServerEndpoint(reactor, self.socket).listen(
            Factory.forProtocol(lambda: Silent(self.asked))
        )
        self.addCleanup(port.stopListening)
        self.pool = RunnerPool(reactor, unix_connect(reactor), per_socket=2)

    def forwarding(self) -> tuple[Deferred[None], DummyRequest]:
        request = DummyRequest([b"v1", b"completions"])
        request.method = b"POST"
        forwarder = Forwarder(self.pool, error_event)
        return Deferred.fromCoroutine(forwarder.forward(request, self.socket, b"/v1/x", b"{}")), request

    def test_a_client_gone_while_connecting_is_a_cancellation(self) -> None:
        forwarding, request = self.forwarding()
        request.channel = None  # as the client's connectionLost leaves it
        forwarding.cancel()  # the connection is made on the reactor's next turn: this stops the connecting
        self.failureResultOf(forwarding, CancelledError)

    async def test_a_client_gone_while_waiting_for_the_answer_is_a_cancellation(self) -> None:
        forwarding, request = self.forwarding()
        self.assertTrue((await self.asked).startswith(b"POST /v1/x HTTP/1.1\r\n"))
        request.channel = None
        forwarding.cancel()
        self.failureResultOf(forwarding, CancelledError)
