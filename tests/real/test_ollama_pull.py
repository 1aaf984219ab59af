"""Real: ``mrunner pull ollama.com/...`` against the real distribution registry holding Ollama-format
manifests and blobs (``[registry] ollama`` points Ollama's names at it; nothing reaches the internet),
the model the same one ``mrunner import ollama:...`` makes and answered by the real llama-server through
the daemon; a stand-in registry cuts and corrupts blobs, and a manifest mrunner cannot serve is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.utils import getProcessOutputAndValue

from mrunner.errors import BadGateway, BadRequest
from mrunner.store.artifact import GGUF, LICENSE, parse_config
from mrunner.store.sources.catalog import Sources
from mrunner.store.sources.ollama import ADAPTER
from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.cli_cases import MRUNNER
from tests.support.daemon import http
from tests.support.llamacpp_cases import LlamaCppTestCase
from tests.support.ollama_registry import OllamaRegistryCase, push_ollama
from tests.support.registry_server import SKIP, RealRegistry
from tests.support.tool_folders import ollama_manifest, ollama_model, sha256

NAME = "ollama.com/library/tiny:1b"


class OllamaPullTests(OllamaRegistryCase):
    skip = SKIP

    async def test_pulled_as_the_import_makes_it_under_each_spelling(self) -> None:
        await self.real()
        other = self.side("other")
        model = await other.pull(NAME)
        self.assertEqual(model.tags, (NAME,))
        self.assertEqual(Path(model.gguf).read_bytes(), self.gguf.read_bytes())
        manifest = other.store.manifest(model.id)
        self.assertEqual([layer.media_type for layer in manifest.layers], [GGUF, LICENSE])
        self.assertEqual(
            {url.rsplit("/", 1)[-1] for url in other.http.blob_gets()},
            {layer.digest for layer in manifest.layers},
            "the template, params and Ollama's config are not fetched",
        )
        progress = [line for line in other.lines if line["type"] == "progress"]
        self.assertEqual(progress[-1]["total"], sum(layer.size for layer in manifest.layers))

        ollama = self.dir / "ollama"
        ollama_model(ollama, "tiny", "1b", self.gguf)
        store = self.side("imported").store
        imported, _ = await Sources({"ollama": ollama}, store).import_("ollama:tiny:1b", None)
        made = store.manifest(imported.id)
        self.assertEqual((made.layers, imported.tags), (manifest.layers, model.tags))
        self.assertEqual(
            parse_config(other.store.blobs.read(manifest.config.digest))[0],
            parse_config(store.blobs.read(made.config.digest))[0],
        )

        other.http.requests.clear()
        for spelling in ("registry.ollama.ai/library/tiny:1b", "ollama.com/tiny:1b", NAME):
            again = await other.pull(spelling)
            self.assertEqual((again.id, again.tags), (model.id, (NAME,)))
        self.assertEqual(other.http.blob_gets(), [], "a model pulled again moves no blob")

    async def test_resume_in_the_next_pull(self) -> None:
        weights = self.gguf.read_bytes()
        cut = len(weights) // 2
        registry = await self.stand_in(cut_at=cut)
        first = self.side("other", attempts=1)
        error = await self.assertFailure(ensureDeferred(first.pull(NAME)), BadGateway)
        self.assertIn("resumes next time", error.message)
        partial = [f for f in first.files() if f.endswith(".incomplete")]
        self.assertEqual([os.path.getsize(first.store.blobs.root / f) for f in partial], [cut])
        self.assertEqual(first.store.list(), [])
        registry.cut_at = None
        model = await self.side("other").pull(NAME)
        self.assertEqual(Path(model.gguf).read_bytes(), weights)
        resumed = [s.range for s in registry.blob_requests() if sha256(weights) in s.path]
        self.assertEqual(resumed[-1], f"bytes={cut}-")

    async def test_a_corrupt_blob_is_refused_and_nothing_is_left(self) -> None:
        await self.stand_in(corrupt=True)
        other = self.side("other")
        error = await self.assertFailure(ensureDeferred(other.pull(NAME)), BadGateway)
        self.assertIn("corrupt blob", error.message)
        self.assertEqual((other.files(), other.store.list()), ([], []))

    async def test_a_manifest_mrunner_cannot_serve_is_refused_before_any_download(self) -> None:
        adapter = {"mediaType": ADAPTER, "digest": sha256(b"lora"), "size": 4}
        self.manifest, blobs = ollama_manifest(self.gguf, extra_layers=[adapter])
        self.blobs = {**blobs, sha256(b"lora"): b"lora"}
        registry = await self.stand_in()
        other = self.side("other")
        error = await self.assertFailure(ensureDeferred(other.pull(NAME)), BadGateway)
        self.assertIn("LoRA adapter", error.message)
        self.assertEqual((registry.blob_requests(), other.files()), ([], []))

    async def test_a_name_deeper_than_namespace_and_model_is_refused(self) -> None:
        error = await self.assertFailure(
            ensureDeferred(self.side("other").pull("ollama.com/a/b/c:1")), BadRequest
        )
        self.assertEqual(error.code, "invalid_ollama_name")


class OllamaPullDaemonTests(LlamaCppTestCase):
    skip = SKIP

    async def test_mrunner_pull_then_the_model_answers(self) -> None:
        root = Path(self.mktemp())
        registry = RealRegistry(root)
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        gguf = root / "tiny.gguf"
        write_tiny_llama(gguf, seed=8)
        await push_ollama(registry.host, "library/tiny:1b", *ollama_manifest(gguf))
        await self.start(f'[registry]\nollama = "{registry.host}"\n')
        env = {**os.environ, "MRUNNER_HOST": self.daemon.url}
        out, err, code = await getProcessOutputAndValue(
            MRUNNER, ("pull", "ollama.com/tiny:1b"), env=env, reactor=reactor
        )
        self.assertEqual(code, 0, err.decode())
        self.assertIn(f"Model pulled successfully: {NAME}", out.decode())
        listed = json.loads(await (await http.get(f"{self.daemon.url}/models")).text())
        self.assertEqual([entry["tags"] for entry in listed], [[NAME]])
        for name in (NAME, "registry.ollama.ai/library/tiny:1b"):
            completion = await self.call(
                self.client.chat.completions.create,
                model=name,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
            )
            self.assertTrue(completion.choices[0].finish_reason)
