"""Real: other tools' models, laid out as Ollama, the Hugging Face cache and LM Studio write them, listed by
``mrunner ls --found``, brought over by ``mrunner import`` as hard links (same inode, no second copy),
answered by the real llama-server, and removed from mrunner with the tool's files left as they were."""

from __future__ import annotations

import json
import os
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.cli_cases import MRUNNER
from tests.support.daemon import http
from tests.support.llamacpp_cases import LlamaCppTestCase
from tests.support.tool_folders import hf_cache_repo, lmstudio_repo, ollama_blob_path, ollama_model


class FoundModelsTests(LlamaCppTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        self.tools = Path(self.mktemp()).absolute()
        self.roots = {name: self.tools / name for name in ("ollama", "hf", "lmstudio", "llamacpp")}
        for root in self.roots.values():
            root.mkdir(parents=True)
        self.gguf = self.tools / "tiny-F32.gguf"
        write_tiny_llama(self.gguf, seed=3)
        folders = "\n".join(
            f'{key.replace("hf", "huggingface")} = "{root}"' for key, root in self.roots.items()
        )
        await self.start(f"[sources]\n{folders}\n")

    async def mrunner(self, *args: str) -> str:
        env = {**os.environ, "MRUNNER_HOST": self.daemon.url}
        out, err, code = await getProcessOutputAndValue(MRUNNER, args, env=env, reactor=reactor)
        self.assertEqual(code, 0, f"mrunner {' '.join(args)} failed: {err.decode()}")
        return out.decode()

    async def answers(self, model: str) -> None:
        completion = await self.call(
            self.client.chat.completions.create,
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
        )
        self.assertEqual(completion.model, model)
        self.assertTrue(completion.choices[0].finish_reason)

    async def test_each_tool_s_model_found_imported_served_and_removed(self) -> None:
        ggufs = {tool: self.tools / tool / "tiny-F32.gguf" for tool in ("o", "h", "l")}
        for seed, path in enumerate(ggufs.values()):
            path.parent.mkdir()
            write_tiny_llama(path, seed=seed)
        ollama_model(self.roots["ollama"], "tiny", "1b", ggufs["o"])
        snapshot = hf_cache_repo(self.roots["hf"], "org/tiny-GGUF", {"tiny-F32.gguf": ggufs["h"]})
        folder = lmstudio_repo(self.roots["lmstudio"], "pub/tiny-GGUF", {"tiny-F32.gguf": ggufs["l"]})
        sources = {
            "ollama:tiny:1b": (
                "ollama.com/library/tiny:1b",
                ollama_blob_path(self.roots["ollama"], ggufs["o"].read_bytes()),
            ),
            "hf-cache:org/tiny-GGUF:F32": ("hf.co/org/tiny-gguf:F32", (snapshot / "tiny-F32.gguf").resolve()),
            "lmstudio:pub/tiny-GGUF:F32": ("lmstudio/pub/tiny-gguf:F32", folder / "tiny-F32.gguf"),
        }
        listed = await self.mrunner("ls", "--found")
        for ref in sources:
            self.assertIn(ref, listed)
        found = json.loads(await self.mrunner("ls", "--found", "--json"))
        self.assertEqual({entry["quantization"] for entry in found}, {"F32"})
        blobs = self.home / "models" / "blobs" / "sha256"
        for ref, (name, source) in sources.items():
            self.assertIn(f"as {name}: linked", await self.mrunner("import", ref))
            await self.answers(name)
            linked = [p for p in blobs.iterdir() if os.stat(p).st_ino == os.stat(source).st_ino]
            self.assertEqual(len(linked), 1, "the store's weights are the tool's file, not a copy")
        marked = json.loads(await self.mrunner("ls", "--found", "--json"))
        self.assertEqual(
            sorted(n for entry in marked for n in entry["in_store"]), sorted(n for n, _ in sources.values())
        )
        for (name, source), original in zip(sources.values(), ggufs.values(), strict=True):
            await self.mrunner("rm", "--force", name)
            self.assertEqual(source.read_bytes(), original.read_bytes(), "the tool's file is left as it was")
        self.assertEqual(json.loads(await (await http.get(f"{self.daemon.url}/models")).text()), [])

    async def test_a_lying_blob_is_refused_and_nothing_is_left(self) -> None:
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        blob = ollama_blob_path(self.roots["ollama"], self.gguf.read_bytes())
        write_tiny_llama(blob, seed=4)
        code, body = await self.post("/models/import", {"from": "ollama:tiny:1b"})
        self.assertEqual((code, body["error"]["code"]), (422, "source_refused"))
        self.assertIn("hashes to", body["error"]["message"])
        self.assertEqual(json.loads(await (await http.get(f"{self.daemon.url}/models")).text()), [])
        self.assertEqual([p.name for p in (self.home / "models" / "blobs" / "sha256").iterdir()], [])
