"""The base of the tests that pull from the stand-in Hugging Face hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent

from mrunner.config import HuggingFaceConfig, RegistryConfig
from mrunner.names import parse
from mrunner.store.huggingface import HubClient
from mrunner.store.local import ModelStore
from mrunner.store.progress import Progress
from mrunner.store.pull import Puller
from mrunner.store.registry import RegistryClient
from mrunner.values.model import Model
from tests.support.ggufs import write_tiny_gguf
from tests.support.hub_server import Repo, StandInHub


class HubTestCase(TestCase):
    """A stand-in Hub with a few repositories, and a store to pull them into."""

    timeout = 20

    def setUp(self) -> Deferred[None]:
        return ensureDeferred(self.serve())

    async def serve(self, **kw: Any) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()
        self.weights = {}
        for quant, seed in (("Q4_K_M", 1), ("Q8_0", 2)):
            path = self.dir / f"tiny-{quant}.gguf"
            write_tiny_gguf(path, rows=4096, seed=seed)
            self.weights[quant] = path.read_bytes()
        write_tiny_gguf(self.dir / "big.gguf", shards=True, seed=3)
        self.shards = [(self.dir / f"big-0000{n}-of-00002.gguf").read_bytes() for n in (1, 2)]
        write_tiny_gguf(self.dir / "mmproj.gguf", architecture="clip", seed=4)
        self.projector = (self.dir / "mmproj.gguf").read_bytes()
        self.hub = StandInHub({}, **kw)
        self.hub.add(
            "team/tiny-gguf",
            Repo(
                {
                    "tiny-Q4_K_M.gguf": self.weights["Q4_K_M"],
                    "tiny-Q8_0.gguf": self.weights["Q8_0"],
                    "mmproj-tiny-f16.gguf": self.projector,
                    "README.md": b"# tiny",
                }
            ),
        )
        self.hub.add(
            "team/big-gguf",
            Repo(
                {
                    f"Q8_0/big-Q8_0-0000{n}-of-00002.gguf": shard
                    for n, shard in zip((1, 2), self.shards, strict=True)
                }
            ),
        )
        self.hub.add("team/gated-gguf", Repo({"g-Q4_K_M.gguf": self.weights["Q4_K_M"]}, gated=True))
        self.hub.add("team/private-gguf", Repo({"p-Q4_K_M.gguf": self.weights["Q4_K_M"]}, private=True))
        self.hub.add("team/safetensors", Repo({"model.safetensors": b"st", "config.json": b"{}"}))
        self.endpoint = self.hub.start()
        self.addCleanup(lambda: ensureDeferred(self.hub.stop()))
        self.lines: list[dict[str, Any]] = []

    def puller(
        self, token: str | None = None, home: str = "home", read_timeout: float = 10.0, **kw: Any
    ) -> Puller:
        self.store = ModelStore(self.dir / home, reactor)  # type: ignore[arg-type]
        http = HTTPClient(Agent(reactor, pool=None))
        config = HuggingFaceConfig(endpoint=self.endpoint, token=token)
        hub = HubClient(config, http, {}, reactor, read_timeout)  # type: ignore[arg-type]
        registry = RegistryClient(RegistryConfig(), reactor, http, read_timeout)  # type: ignore[arg-type]
        return Puller(self.store, registry, hub=hub, read_timeout=read_timeout, **kw)

    async def pull(self, puller: Puller, name: str) -> Model:
        return await puller.pull(parse(name), Progress(self.lines.append, reactor, "pull"))  # type: ignore[arg-type]
