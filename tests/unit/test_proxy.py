"""The forwarding resource's handling of the client connection, without processes or sockets."""

from __future__ import annotations

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectingCancelledError
from twisted.internet.interfaces import ITCPTransport
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseNeverReceived
from twisted.web.http import HTTPChannel, Request
from twisted.web.test.requesthelper import DummyRequest
from zope.interface import implementer

from mrunner.proxy import Forwarder, start_event_stream


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


class CancelledAgent:
    """An agent whose request, once cancelled, fails with C{error}, as Twisted's do at each stage."""

    def __init__(self, error: Exception):
        self._error = error

    def request(
        self, method: bytes, uri: bytes, headers: object = None, body: object = None
    ) -> Deferred[None]:
        return Deferred(lambda d: d.errback(self._error))


class CancelTests(SynchronousTestCase):
    def cancelled(self, error: Exception) -> None:
        request = DummyRequest([b"v1", b"completions"])
        request.method = b"POST"
        forwarder = Forwarder(CancelledAgent(error))
        forwarding = Deferred.fromCoroutine(forwarder.forward(request, "/r.sock", b"/v1/completions", b"{}"))
        request.channel = None  # as the client's connectionLost leaves it
        forwarding.cancel()
        self.failureResultOf(forwarding, CancelledError)

    def test_a_client_gone_while_connecting_is_a_cancellation(self) -> None:
        self.cancelled(ConnectingCancelledError(None))

    def test_a_client_gone_while_waiting_for_the_answer_is_a_cancellation(self) -> None:
        self.cancelled(ResponseNeverReceived([Failure(CancelledError())]))
