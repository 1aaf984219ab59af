"""The daemon's HTTP clients log nothing per connection (real sockets, on the real reactor)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.endpoints import UNIXServerEndpoint
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.resource import Resource
from twisted.web.server import Site

from mrunner.proxy import health_agent


class Health(Resource):
    isLeaf = True

    def render_GET(self, request: Any) -> bytes:
        return b"ok"


class QuietTests(TestCase):
    async def requests(self, agent_for: Any) -> list[str]:
        """What is logged while C{agent_for(run_dir)} asks a runner socket three times."""
        run = Path(tempfile.mkdtemp(prefix="mr-"))
        self.addCleanup(shutil.rmtree, run, True)
        port = await UNIXServerEndpoint(reactor, str(run / "r.sock")).listen(Site(Health()))
        self.addCleanup(port.stopListening)
        said: list[str] = []

        def observe(event: dict[str, Any]) -> None:
            said.append(str(event.get("log_format")))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        agent = agent_for(run)
        for _ in range(3):
            self.assertEqual(await readBody(await agent.request(b"GET", b"http://r/health")), b"ok")
        return [line for line in said if "factory" in line.lower()]

    async def test_health_checks_log_no_factory_lines(self) -> None:
        self.assertEqual(await self.requests(lambda run: health_agent(reactor, run)), [])

    async def test_stock_twisted_would(self) -> None:
        """The lines the quiet pool keeps out (so the test above can fail)."""
        from mrunner.proxy import RunnerEndpoints

        def stock(run: Path) -> Agent:
            pool = HTTPConnectionPool(reactor, persistent=False)
            return Agent.usingEndpointFactory(reactor, RunnerEndpoints(reactor, run), pool)

        self.assertIn("Starting factory {factory!r}", await self.requests(stock))
