"""A Whisper model pushed to the real distribution registry and pulled back into another store, in
Docker Model Runner's artifact style with its own media type."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.defer import ensureDeferred

from mrunner.store import artifact
from mrunner.testing import tinywhisper
from tests.support.registry_cases import RegistryTestCase
from tests.support.registry_server import SKIP, RealRegistry


class WhisperRegistryTests(RegistryTestCase):
    skip = SKIP

    async def test_push_then_pull(self) -> None:
        registry = RealRegistry(self.dir / "registry")
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        path = self.dir / "ggml-tiny.bin"
        tinywhisper.write(path)
        with path.open("rb") as f:
            model = await self.source.store.import_gguf("whisper", f)
        name = f"{registry.host}/team/whisper:tiny"
        self.source.store.tag("whisper", name)
        self.assertEqual(await self.source.push(name), model.id)
        other = self.side("other")
        pulled = await other.pull(name)
        self.assertEqual(pulled.id, model.id)
        self.assertEqual(Path(pulled.gguf).read_bytes(), path.read_bytes())
        layers = [layer.media_type for layer in other.store.manifest(pulled.id).layers]
        self.assertEqual(layers, [artifact.WHISPER])
        self.assertEqual(pulled.config["format"], "whisper")
