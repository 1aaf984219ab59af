"""Ollama's registry for tests: Ollama-format models pushed to the real distribution registry, or served
by the stand-in that misbehaves, with ``[registry] ollama`` pointing ``ollama.com`` at it."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent

from mrunner.config import RegistryConfig
from mrunner.names import parse
from mrunner.store.registry import RegistryClient
from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.registry_cases import Side
from tests.support.registry_server import RealRegistry, StandInRegistry
from tests.support.tool_folders import OLLAMA_MANIFEST, ollama_manifest


async def push_ollama(host: str, name: str, manifest: bytes, blobs: dict[str, bytes]) -> None:
    """Push an Ollama model (L{ollama_manifest}) as C{name} (``namespace/model:tag``) to the registry at
    C{host}, as Ollama's registry holds it."""
    client = RegistryClient(RegistryConfig(), reactor, HTTPClient(Agent(reactor, pool=None)))
    ref = parse(f"{host}/{name}")
    (repo,) = client.repositories(ref, pull=False)
    for digest, data in blobs.items():
        await client.upload_blob(repo, digest, partial(bytes, data))
    assert ref.tag is not None
    await client.put_manifest(repo, ref.tag, manifest, OLLAMA_MANIFEST)


class OllamaRegistryCase(TestCase):
    """A tiny llama in Ollama's format (L{ollama_manifest}); stores that pull it from ``ollama.com``."""

    timeout = 60

    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()
        self.gguf = self.dir / "tiny.gguf"
        write_tiny_llama(self.gguf, seed=7)
        self.manifest, self.blobs = ollama_manifest(self.gguf)
        self.config = RegistryConfig()

    async def real(self) -> str:
        """The real registry holding the model as ``library/tiny:1b``; its host."""
        registry = RealRegistry(self.dir / "registry")
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        await push_ollama(registry.host, "library/tiny:1b", self.manifest, self.blobs)
        self.config = RegistryConfig(ollama=registry.host)
        return registry.host

    async def stand_in(self, **faults: Any) -> StandInRegistry:
        """The stand-in serving the model as tag ``1b``, with C{faults}."""
        self.registry = registry = StandInRegistry(
            {"1b": (OLLAMA_MANIFEST, self.manifest)}, self.blobs, **faults
        )
        host = await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        self.config = RegistryConfig(ollama=host)
        return registry

    def side(self, name: str, **kw: Any) -> Side:
        """A store pulling through C{self.config} (a registry client and puller of its own)."""
        return Side(self.dir / name, self.config, **kw)
