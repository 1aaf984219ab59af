"""The registry's and the hub's HTTP client logs nothing per connection (real sockets, real reactor)."""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.resource import Resource
from twisted.web.server import Site

from mrunner.store.clientpool import QuietPool


class Health(Resource):
    isLeaf = True

    def render_GET(self, request: Any) -> bytes:
        return b"ok"


class QuietTests(TestCase):
    async def requests(self, pool: HTTPConnectionPool) -> list[str]:
        """What is logged while an C{Agent} on C{pool} asks a server three times, a connection each."""
        port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Site(Health()))
        self.addCleanup(port.stopListening)
        url = b"http://127.0.0.1:%d/health" % port.getHost().port
        said: list[str] = []

        def observe(event: dict[str, Any]) -> None:
            said.append(str(event.get("log_format")))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        agent = Agent(reactor, pool=pool)
        for _ in range(3):
            self.assertEqual(await readBody(await agent.request(b"GET", url)), b"ok")
        return [line for line in said if "factory" in line.lower()]

    async def test_the_quiet_pool_logs_no_factory_lines(self) -> None:
        self.assertEqual(await self.requests(QuietPool(reactor, persistent=False)), [])

    async def test_stock_twisted_would(self) -> None:
        """The lines the quiet pool keeps out (so the test above can fail)."""
        self.assertIn("Starting factory {factory!r}", await self.requests(HTTPConnectionPool(reactor, False)))
