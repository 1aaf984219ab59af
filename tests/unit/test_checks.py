"""mrunner's own GETs of runners (health, scrapes): a connection each, none kept, none logged."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import UNIXServerEndpoint
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.logger import globalLogPublisher
from twisted.protocols.policies import WrappingFactory
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from mrunner.proxy.pool import RunnerPool, unix_connect
from mrunner.runners.checks import RunnerChecks


class Health(Resource):
    isLeaf = True
    code = 200

    def render_GET(self, request: Any) -> bytes:
        request.setResponseCode(self.code)
        return b"ok"


class Connections(WrappingFactory):
    """Counts the connections made to it; C{closed()} fires once every one of them has closed."""

    def __init__(self, wrapped: Any):
        super().__init__(wrapped)
        self.made = 0
        self._waiting: list[Deferred[None]] = []

    def registerProtocol(self, p: Any) -> None:
        self.made += 1
        super().registerProtocol(p)

    def unregisterProtocol(self, p: Any) -> None:
        super().unregisterProtocol(p)
        if not self.protocols:
            waiting, self._waiting = self._waiting, []
            for d in waiting:
                d.callback(None)

    def closed(self) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if self.protocols:
            self._waiting.append(d)
        else:
            d.callback(None)
        return d


class ChecksTests(TestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        run = Path(tempfile.mkdtemp(prefix="mr-"))
        self.addCleanup(shutil.rmtree, run, True)
        self.socket = str(run / "r.sock")
        self.health = Health()
        self.runner = Connections(Site(self.health))
        port = await UNIXServerEndpoint(reactor, self.socket).listen(self.runner)
        self.addCleanup(port.stopListening)
        self.checks = RunnerChecks(RunnerPool(reactor, unix_connect(reactor), per_socket=2).fetch)
        self.said: list[str] = []

        def observe(event: dict[str, Any]) -> None:
            self.said.append(str(event.get("log_format")))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)

    def factory_lines(self) -> list[str]:
        return [line for line in self.said if "factory" in line.lower()]

    async def test_each_get_has_a_connection_of_its_own_closed_after_it_and_logged_nowhere(self) -> None:
        for _ in range(3):
            self.assertEqual(await self.checks.get(self.socket, b"/health"), (200, b"ok"))
        await self.runner.closed()
        self.assertEqual(self.runner.made, 3)
        self.assertEqual(self.factory_lines(), [])

    async def test_healthy_is_a_200(self) -> None:
        self.assertTrue(await self.checks.healthy(self.socket))
        self.health.code = 503  # llama-server while it loads the model
        self.assertFalse(await self.checks.healthy(self.socket))
        self.assertFalse(await self.checks.healthy(self.socket + ".none"))  # not listening yet
        await self.runner.closed()

    async def test_stock_twisted_would_log(self) -> None:
        """The lines the checks keep out of the log (so the test above can fail)."""
        connected: Deferred[None] = Deferred()

        class Quit(Protocol):
            def connectionMade(self) -> None:
                self.transport.loseConnection()  # type: ignore[union-attr]

            def connectionLost(self, reason: object = None) -> None:
                connected.callback(None)

        reactor.connectUNIX(self.socket, ClientFactory.forProtocol(Quit))  # type: ignore[attr-defined]
        await connected
        await self.runner.closed()
        self.assertIn("Starting factory {factory!r}", self.factory_lines())
