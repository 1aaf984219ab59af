"""The bases of the tests that pull from and push to a registry: a real one, or the stand-in."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent

from mrunner.config import RegistryConfig
from mrunner.errors import BadGateway
from mrunner.names import parse
from mrunner.store.artifact import OCI_MANIFEST, Manifest
from mrunner.store.local import ModelStore
from mrunner.store.progress import Progress
from mrunner.store.pull import Puller
from mrunner.store.push import Pusher
from mrunner.store.registry import RegistryClient
from mrunner.values.model import Model
from tests.support.ggufs import write_tiny_gguf
from tests.support.registry_server import StandInRegistry


class RecordingHTTP:
    """treq's client, noting each request, so a test can see what went over the wire."""

    def __init__(self) -> None:
        self._http = HTTPClient(Agent(reactor, pool=None))
        self.requests: list[tuple[str, str]] = []

    def request(self, method: str, url: str, **kw: Any) -> Deferred[Any]:
        self.requests.append((method, url))
        return self._http.request(method, url, **kw)

    def get(self, url: str, **kw: Any) -> Deferred[Any]:
        return self.request("GET", url, **kw)

    def blob_gets(self) -> list[str]:
        return [url for method, url in self.requests if method == "GET" and "/blobs/" in url]


class Side:
    """One daemon's store with its registry client, puller and pusher."""

    def __init__(self, home: Path, config: RegistryConfig, read_timeout: float = 10.0, **puller: Any) -> None:
        self.store = ModelStore(home, reactor)  # type: ignore[arg-type]
        self.http = RecordingHTTP()
        self.client = RegistryClient(config, reactor, self.http, read_timeout)  # type: ignore[arg-type]
        self.puller = Puller(self.store, self.client, read_timeout=read_timeout, **puller)
        self.pusher = Pusher(self.store, self.client, reactor)  # type: ignore[arg-type]
        self.lines: list[dict[str, Any]] = []

    def progress(self, mode: str) -> Progress:
        return Progress(self.lines.append, reactor, mode)  # type: ignore[arg-type]

    async def pull(self, name: str) -> Model:
        return await self.puller.pull(parse(name), self.progress("pull"))

    async def push(self, name: str) -> str:
        return await self.pusher.push(parse(name), self.progress("push"))

    def files(self) -> list[str]:
        return sorted(os.listdir(self.store.blobs.root))


class RegistryTestCase(TestCase):
    timeout = 60  # a safety net: on a busy core a pull of a split model took over 10 s

    def setUp(self) -> Deferred[None]:
        return ensureDeferred(self.setUpSource())

    async def setUpSource(self) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()
        self.config = RegistryConfig()
        self.source = Side(self.dir / "source", self.config)
        gguf = self.dir / "tiny.gguf"
        write_tiny_gguf(gguf, rows=4096)  # 256 KiB of weights: several network reads
        with gguf.open("rb") as f:
            self.model: Model = await self.source.store.import_gguf("tiny", f)
        self.weights = gguf.read_bytes()

    def side(self, name: str, **kw: Any) -> Side:
        return Side(self.dir / name, self.config, **kw)


class StandInTestCase(RegistryTestCase):
    """The source's model served by a stand-in registry, with the faults a test asks for."""

    extra_blobs: dict[str, bytes] = {}

    async def serve(self, manifest: Manifest | None = None, **kw: Any) -> str:
        store = self.source.store
        manifest = manifest or store.manifest(self.model.id)
        blobs = {b.digest: store.blobs.read(b.digest) for b in manifest.blobs if store.blobs.has(b.digest)}
        blobs.update(self.extra_blobs)
        entry = (OCI_MANIFEST, manifest.to_bytes())
        self.registry = registry = StandInRegistry({"v1": entry}, blobs, **kw)
        host = await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        self.config = RegistryConfig(
            insecure=(host,), auth={host: {"username": "alice", "password": "secret"}}
        )
        return f"{host}/team/tiny:v1"

    async def refused(self, name: str, fragment: str) -> None:
        error = await self.assertFailure(ensureDeferred(self.side("other").pull(name)), BadGateway)
        self.assertIn(fragment, error.message)
        self.assertEqual(error.status, 502)
