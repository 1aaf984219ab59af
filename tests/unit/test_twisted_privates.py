"""Twisted's private names mrunner relies on, pinned: a Twisted release that changes one fails here.

They are reached in one module per layer, and only there (L{PLACES}):
mrunner/proxy/fastio.py writes to and connects sockets past Twisted's public
API for speed, mrunner/api/door/webprivate.py gives the front door twisted.web's
parser state and body decoder under public names, mrunner/store/clientpool.py swaps
the pool's private factory, mrunner/daemon/startup.py makes a failed listen raise,
and mrunner/daemon/lazytls.py names Twisted's private SNI module (pinned by
tests/real/test_lazytls.py). pyproject.toml bounds Twisted to the releases these
tests passed on; raise the bound only with them passing on the new release.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from pathlib import Path
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet import epollreactor, reactor, tcp, unix
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import UNIXServerEndpoint
from twisted.internet.protocol import ClientFactory, Factory, Protocol
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web import client, http, http_headers

import mrunner
from mrunner.proxy.fastio import RecvClient, RecvConnector, reading, send_now
from tests.support.private_names import private_reaches

#: Every module that reaches a Twisted private name, and the names it reaches.
PLACES = {
    "mrunner.api.door.webprivate": {
        "_ChunkedTransferDecoder",
        "_MalformedChunkedDataError",
        "_buffer",
        "_busyReceiving",
        "_command",
        "_dataReceived_CHUNK_LENGTH",
        "_finishRequestBody",
        "_handlingRequest",
        "_maybeChooseTransferDecoder",
        "_nameEncoder",
        "_path",
        "_rawHeaders",
        "_receivedHeaderCount",
        "_respondToBadRequestAndDisconnect",
        "_transferDecoder",
        "_version",
    },
    "mrunner.proxy.fastio": {"_makeTransport", "_reads", "_tempDataBuffer"},
    "mrunner.store.clientpool": {"_HTTP11ClientFactory", "_factory"},
    "mrunner.daemon.startup": {"_raiseSynchronously", "_waitingForPort"},
    "mrunner.daemon.lazytls": {"twisted.protocols._sni"},
}


class PlacesTests(SynchronousTestCase):
    """Twisted's private names are reached only in L{PLACES}' modules."""

    def test_only_these_modules_reach_twisted_privates(self) -> None:
        """A new reach fails here: put it behind its layer's module and pin it below, or use a public name."""
        self.assertEqual(private_reaches(Path(mrunner.__file__).parent), PLACES)


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


class Collect(Protocol):
    """Keeps what it receives; C{received(n)} fires once C{n} bytes have come."""

    def __init__(self) -> None:
        self.data = b""
        self.made: Deferred[None] = Deferred()
        self._waiting: tuple[int, Deferred[bytes]] | None = None

    def connectionMade(self) -> None:
        self.made.callback(None)

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        if self._waiting is not None and len(self.data) >= self._waiting[0]:
            (_, d), self._waiting = self._waiting, None
            d.callback(self.data)

    def received(self, size: int) -> Deferred[bytes]:
        d: Deferred[bytes] = Deferred()
        self._waiting = (size, d)
        self.dataReceived(b"")
        return d


class FastIOTests(TestCase):
    """L{send_now} and the plain-C{recv} UNIX client, on a real socket and the real reactor."""

    async def setUp(self) -> None:  # type: ignore[override]
        run = Path(tempfile.mkdtemp(prefix="mr-"))
        self.addCleanup(shutil.rmtree, run, True)
        socket = str(run / "r.sock")
        self.server = Collect()
        port = await UNIXServerEndpoint(reactor, socket).listen(Factory.forProtocol(lambda: self.server))
        self.addCleanup(port.stopListening)
        self.client = Collect()
        RecvConnector(socket, ClientFactory.forProtocol(lambda: self.client), 30, reactor, False).connect()
        await self.client.made
        await self.server.made
        self.transport: Any = self.client.transport

    async def tearDown(self) -> None:  # type: ignore[override]
        lost: Deferred[None] = Deferred()
        self.client.connectionLost = lambda reason: lost.callback(None)  # type: ignore[method-assign]
        self.transport.loseConnection()
        await lost

    def test_the_connector_makes_the_recv_client(self) -> None:
        """C{unix.Connector._makeTransport} is still what makes a connection's transport, and how."""
        self.assertIs(type(self.transport), RecvClient)
        self.assertEqual(
            parameters(unix.Client.__init__), ["self", "filename", "connector", "reactor", "checkPID"]
        )
        self.assertEqual(parameters(unix.Connector._makeTransport), ["self"])

    async def test_the_recv_client_reads(self) -> None:
        """C{tcp.Connection.doRead} still reads a UNIX client's socket."""
        self.server.transport.write(b"hello")  # type: ignore[union-attr]
        self.assertEqual(await self.client.received(5), b"hello")

    async def test_send_now_sends_at_once_and_keeps_the_order(self) -> None:
        """The write queue is still C{dataBuffer} and C{_tempDataBuffer}, and C{writeSomeData} sends."""
        transport = self.transport
        self.assertIsInstance(transport, tcp.Connection)
        self.assertEqual((transport.TLS, transport.disconnecting), (False, False))
        self.assertTrue(transport.connected)
        self.assertEqual((transport.dataBuffer, transport._tempDataBuffer), (b"", []))
        send_now(transport, b"first ")
        self.assertEqual((transport.dataBuffer, transport._tempDataBuffer), (b"", []), "sent, not queued")
        self.assertNotIn(transport, reactor.getWriters())  # type: ignore[attr-defined]
        transport.write(b"second ")  # queued for the reactor's next turn, where send_now looks
        self.assertEqual(transport._tempDataBuffer, [b"second "])
        send_now(transport, b"third")
        self.assertEqual(transport._tempDataBuffer, [b"second ", b"third"], "queued behind")
        self.assertEqual(await self.server.received(18), b"first second third")

    def test_reading_is_what_the_reactor_reads(self) -> None:
        """The epoll reactor's C{_reads} still holds the descriptors it reads, as C{getReaders} says."""
        self.assertIsInstance(reactor, epollreactor.EPollReactor)
        self.assertTrue(reading(reactor, self.transport))
        self.assertIn(self.transport, reactor.getReaders())  # type: ignore[attr-defined]
        self.transport.stopReading()
        self.assertFalse(reading(reactor, self.transport))
        self.assertNotIn(self.transport, reactor.getReaders())  # type: ignore[attr-defined]
        self.transport.startReading()
        self.assertTrue(reading(reactor, self.transport))


class Recording(http.HTTPChannel):
    """An HTTP channel that records what twisted.web asks of C{_maybeChooseTransferDecoder}."""

    def __init__(self) -> None:
        super().__init__()
        self.chosen: list[tuple[bytes, bytes]] = []

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:
        self.chosen.append((header, data))
        return bool(super()._maybeChooseTransferDecoder(header, data))


class Sizes(http._ChunkedTransferDecoder):
    """Records the chunk sizes read, as the front door's C{SizedChunks} (in api/door/webprivate.py) does."""

    def __init__(self, *callbacks: Any) -> None:
        super().__init__(*callbacks)
        self.sizes: list[int] = []

    def _dataReceived_CHUNK_LENGTH(self) -> bool:
        read = bool(super()._dataReceived_CHUNK_LENGTH())
        if read:
            self.sizes.append(self.length)
        return read


class WebTests(SynchronousTestCase):
    """twisted.web's private names that api/door/webprivate.py and store/clientpool.py use."""

    def channel(self, head: bytes) -> Recording:
        channel = Recording()
        channel.makeConnection(StringTransport())
        channel.dataReceived(head)
        return channel

    def test_the_channel_chooses_the_body_decoder_by_canonical_header(self) -> None:
        channel = self.channel(b"POST /v1/x HTTP/1.1\r\ncontent-length: 5\r\nx-a: 1\r\n\r\n")
        self.assertEqual(channel.chosen, [(b"Content-Length", b"5"), (b"X-A", b"1")])
        self.assertEqual((channel._command, channel._path, channel.length), (b"POST", b"/v1/x", 5))
        self.assertEqual(channel._version, b"HTTP/1.1")
        self.assertEqual(channel.requests[0].requestHeaders._rawHeaders[b"X-A"], [b"1"])
        self.assertEqual(http_headers._nameEncoder.encode(b"x-a"), b"X-A")
        self.assertEqual(channel._receivedHeaderCount, 2)
        self.assertIsInstance(channel._receivedHeaderSize, int)
        self.assertIsInstance(channel._handlingRequest, bool)
        channel = self.channel(b"POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        self.assertIs(type(channel._transferDecoder), http._ChunkedTransferDecoder)
        self.assertIsNone(channel.length)
        self.assertTrue(callable(channel._finishRequestBody))
        self.assertTrue(callable(channel._respondToBadRequestAndDisconnect))
        # What the door reads to refuse a head of bare LFs, which LineReceiver holds unended.
        channel = self.channel(b"GET / HTTP/1.1\nHost: x\n")
        self.assertEqual((channel._buffer, channel._busyReceiving), (b"GET / HTTP/1.1\nHost: x\n", False))

    def test_the_chunked_decoder(self) -> None:
        self.assertEqual(
            parameters(http._ChunkedTransferDecoder.__init__), ["self", "dataCallback", "finishCallback"]
        )
        data: list[bytes] = []
        decoder = Sizes(data.append, data.append)
        decoder.dataReceived(b"3\r\nabc\r\n10\r\n")
        self.assertEqual((decoder.sizes, data), ([3, 16], [b"abc"]))
        self.assertTrue(issubclass(http._MalformedChunkedDataError, Exception))
        self.assertRaises(
            http._MalformedChunkedDataError, Sizes(data.append, data.append).dataReceived, b"zz\r\n"
        )

    def test_the_connection_pool_builds_its_connections_with_its_factory(self) -> None:
        self.assertIs(client.HTTPConnectionPool._factory, client._HTTP11ClientFactory)
        self.assertIn("self._factory(", inspect.getsource(client.HTTPConnectionPool._newConnection))


class ApplicationTests(SynchronousTestCase):
    """twisted.application's private names that daemon/startup.py's L{Listener} uses on a failed listen."""

    def test_the_endpoint_service_raises_and_keeps_the_listen(self) -> None:
        self.assertIs(StreamServerEndpointService._raiseSynchronously, False)
        service = StreamServerEndpointService(UNIXServerEndpoint(MemoryReactor(), "/nowhere"), Factory())
        self.assertIsNone(service._waitingForPort)
        service.privilegedStartService()
        self.assertIsInstance(service._waitingForPort, Deferred)
