"""Models of several files: split GGUF shards, a vision projector, a chat template."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends.llamacpp.backend import LlamaCppBackend
from mrunner.backends.llamacpp.sizing import BASE_RSS, memory_estimate
from mrunner.cli.package import TarStream, members
from mrunner.config import Config
from mrunner.errors import BadRequest
from mrunner.store import artifact
from mrunner.store.local import ModelStore
from mrunner.values.backend import RunnerSettings
from mrunner.values.model import Model
from mrunner.values.sizes import format_size
from tests.support.ggufs import write_tiny_gguf
from tests.support.sync_reactor import SyncThreadsClock

TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


class FilesTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.home = Path(self.mktemp())
        self.files = self.home / "files"
        self.files.mkdir(parents=True)
        self.store = ModelStore(self.home, SyncThreadsClock())

    def package(
        self, name: str, first: Path, mmproj: Path | None = None, template: Path | None = None
    ) -> Model:
        stream = TarStream(members(first, [], mmproj, template))
        data = b"".join(stream.chunks(lambda _: None))
        return self.successResultOf(self.store.import_package(name, io.BytesIO(data)))

    def shards(self, seed: int = 0) -> list[Path]:
        write_tiny_gguf(self.files / f"big{seed}.gguf", shards=True, seed=seed)
        return [self.files / f"big{seed}-{n:05d}-of-00002.gguf" for n in (1, 2)]

    def projector(self) -> Path:
        path = self.files / "mmproj-tiny.gguf"
        write_tiny_gguf(path, architecture="clip", seed=7)
        return path


class StoreTests(FilesTestCase):
    def test_a_split_model_is_one_layer_per_shard_in_order(self) -> None:
        paths = self.shards()
        model = self.package("big", paths[0])
        manifest = self.store.manifest(model.id)
        self.assertEqual([layer.media_type for layer in manifest.layers], [artifact.GGUF] * 2)
        self.assertEqual([Path(p).read_bytes() for p in model.shards], [p.read_bytes() for p in paths])
        self.assertEqual(model.config["parameters"], "144")  # both shards' tensors
        self.assertEqual(model.config["size"], format_size(sum(p.stat().st_size for p in paths)))

    def test_shards_are_links_with_llama_cpps_names_beside_the_first(self) -> None:
        model = self.package("big", self.shards()[0])
        self.successResultOf(self.store.ready(self.store.resolve("big")))
        first = Path(model.gguf)
        self.assertEqual(first.name, "model-00001-of-00002.gguf")
        links = sorted(first.parent.iterdir())
        self.assertEqual(
            [link.name for link in links], ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
        )
        self.assertTrue(all(link.is_symlink() for link in links))
        self.assertEqual([link.resolve() for link in links], [Path(p).resolve() for p in model.shards])

    def test_links_come_back_and_go_with_the_model(self) -> None:
        model = self.package("big", self.shards()[0])
        directory = Path(model.gguf).parent
        for link in directory.iterdir():
            link.unlink()
        self.successResultOf(self.store.ready(self.store.resolve("big")))
        self.assertTrue(Path(model.gguf).exists())
        self.store.delete("big")
        self.assertFalse(directory.exists())

    def test_shards_out_of_order_or_missing_are_refused(self) -> None:
        first, second = self.shards()
        for files in ([("a.gguf", second), ("b.gguf", first)], [("a.gguf", first)]):
            data = b"".join(TarStream(files).chunks(lambda _: None))
            error = self.failureResultOf(self.store.import_package("x", io.BytesIO(data)), BadRequest).value
            self.assertEqual(error.code, "invalid_gguf_shards")
            self.assertIn("give every shard of one split model, in order", error.message)
        self.assertEqual(self.store.list(), [])
        self.assertEqual(os.listdir(self.home / "models" / "blobs" / "sha256"), [])

    def test_projector_and_template_are_layers_with_roles(self) -> None:
        template = self.files / "chat.jinja"
        template.write_text(TEMPLATE)
        model = self.package("vision", self.shards()[0], self.projector(), template)
        manifest = self.store.manifest(model.id)
        self.assertEqual(
            [layer.media_type for layer in manifest.layers],
            [artifact.GGUF, artifact.GGUF, artifact.MMPROJ, artifact.CHAT_TEMPLATE],
        )
        self.assertEqual(Path(model.files["chat_template"]).read_text(), TEMPLATE)
        self.assertEqual(Path(model.files["mmproj"]).read_bytes(), self.projector().read_bytes())
        config = json.loads(self.store.blobs.read(manifest.config.digest))
        self.assertEqual(
            [f["type"] for f in config["files"]], [layer.media_type for layer in manifest.layers]
        )

    def test_a_projector_that_is_not_clip_is_refused(self) -> None:
        stream = TarStream(members(self.shards()[0], [], self.shards(1)[0]))
        data = b"".join(stream.chunks(lambda _: None))
        error = self.failureResultOf(self.store.import_package("x", io.BytesIO(data)), BadRequest).value
        self.assertEqual(error.code, "invalid_mmproj")
        self.assertEqual(os.listdir(self.home / "models" / "blobs" / "sha256"), [])


class CommandLineTests(FilesTestCase):
    def backend(self) -> LlamaCppBackend:
        backend = LlamaCppBackend(Config(home=self.home), None, environ={})
        backend._use(Path("/bin/llama-server"), "llama.cpp test", None)
        return backend

    def test_llama_server_gets_the_first_shard_projector_and_template(self) -> None:
        template = self.files / "chat.jinja"
        template.write_text(TEMPLATE)
        model = self.package("vision", self.shards()[0], self.projector(), template)
        args = self.backend().command(model, "completion", "/run/r.sock", RunnerSettings()).args
        self.assertEqual(args[args.index("--model") + 1], model.gguf)
        self.assertEqual(args[args.index("--mmproj") + 1], model.files["mmproj"])
        self.assertEqual(args[args.index("--chat-template-file") + 1], model.files["chat_template"])

    def test_a_plain_model_gets_neither_flag(self) -> None:
        write_tiny_gguf(self.files / "plain.gguf")
        model = self.package("plain", self.files / "plain.gguf")
        args = self.backend().command(model, "completion", "/run/r.sock", RunnerSettings()).args
        self.assertNotIn("--mmproj", args)
        self.assertNotIn("--chat-template-file", args)

    def test_a_draft_model_is_passed_and_counted(self) -> None:
        write_tiny_gguf(self.files / "plain.gguf")
        target = self.package("target", self.files / "plain.gguf")
        draft = self.package("draft", self.shards()[0])
        plain, speculative = RunnerSettings(), RunnerSettings(draft=draft)
        args = self.backend().command(target, "completion", "/run/r.sock", speculative).args
        self.assertEqual(args[args.index("--model-draft") + 1], draft.gguf)
        self.assertEqual(
            memory_estimate(target, speculative) - memory_estimate(target, plain),
            memory_estimate(draft, plain) - BASE_RSS,
        )

    def test_the_estimate_counts_every_shard_and_the_projector(self) -> None:
        paths = self.shards()
        plain = self.package("big", paths[0])
        vision = self.package("vision", paths[0], self.projector())
        settings = RunnerSettings()
        one = Model(id=plain.id, tags=(), created=0, config=plain.config, gguf=plain.shards[0])
        self.assertEqual(
            memory_estimate(plain, settings) - memory_estimate(one, settings), paths[1].stat().st_size
        )
        self.assertEqual(
            memory_estimate(vision, settings) - memory_estimate(plain, settings),
            self.projector().stat().st_size,
        )
