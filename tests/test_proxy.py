"""The forwarding resource's handling of the client connection, without processes or sockets."""

from __future__ import annotations

from twisted.internet.interfaces import ITCPTransport
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http import HTTPChannel, Request
from zope.interface import implementer

from mrunner.proxy import start_event_stream


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
