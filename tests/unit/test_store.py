"""The model store: import, resolve, tag, delete, and what is left on disk."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from zope.interface.verify import verifyClass, verifyObject

from mrunner.errors import BadRequest, Conflict, NotFound
from mrunner.interfaces import IModelStore, IModelStoreAdmin
from mrunner.store import artifact
from mrunner.store.local import ModelStore
from tests.support.store_cases import StoreTestCase, tiny_gguf


class ImportTests(StoreTestCase):
    def test_interfaces(self) -> None:
        """The API takes the store as these interfaces: the store has each of their methods."""
        for interface in (IModelStore, IModelStoreAdmin):
            self.assertTrue(verifyClass(interface, ModelStore))
            self.assertTrue(verifyObject(interface, self.store))

    def test_import_then_resolve(self) -> None:
        model = self.import_model("smollm2")
        self.assertEqual(model.tags, ("ai/smollm2:latest",))
        self.assertEqual(model.created, 1_700_000_000)
        self.assertEqual(
            {k: model.config[k] for k in ("format", "quantization", "architecture")},
            {"format": "gguf", "quantization": "Q4_1", "architecture": "llama"},
        )
        self.assertEqual(model.config["parameters"], "144")
        self.assertEqual(model.config["context_size"], 2048)
        self.assertEqual(model.config["gguf"]["general.name"], "tiny")
        self.assertEqual(Path(model.gguf).read_bytes(), tiny_gguf(self.home))
        for name in ("smollm2", "ai/smollm2", "ai/smollm2:latest", model.id, model.short_id):
            self.assertEqual(self.store.resolve(name), model)

    def test_layout_is_docker_model_runners(self) -> None:
        model = self.import_model("smollm2")
        manifest = json.loads(self.store.manifest_bytes(model.id))
        self.assertEqual(manifest["mediaType"], artifact.OCI_MANIFEST)
        self.assertEqual(manifest["config"]["mediaType"], artifact.MODEL_CONFIG)
        self.assertEqual([layer["mediaType"] for layer in manifest["layers"]], [artifact.GGUF])
        config = json.loads(self.store.blobs.read(manifest["config"]["digest"]))
        self.assertEqual(config["descriptor"], {"created": "2023-11-14T22:13:20Z"})
        self.assertEqual(config["rootfs"]["diff_ids"], [manifest["layers"][0]["digest"]])
        self.assertEqual(model.id, artifact.sha256(self.store.manifest_bytes(model.id)))
        self.assertEqual(len(self.stored_files()), 3)

    def test_quantization_from_tensors_without_file_type(self) -> None:
        model = self.import_model("x", file_type=None, context_length=None)
        self.assertEqual(model.config["quantization"], "F32")
        self.assertNotIn("context_size", model.config)

    def test_persists(self) -> None:
        model = self.import_model("smollm2")
        self.assertEqual(ModelStore(self.home, self.clock).list(), [model])

    def test_list(self) -> None:
        a = self.import_model("a")
        b = self.import_model("b", seed=1)
        self.assertEqual(sorted(m.id for m in self.store.list()), sorted([a.id, b.id]))

    def test_not_gguf_leaves_nothing(self) -> None:
        for data in (b"", b"not a gguf file", tiny_gguf(self.home)[:100]):
            failure = self.failureResultOf(self.store.import_gguf("x", io.BytesIO(data)), BadRequest)
            self.assertIn("not a valid GGUF file", failure.value.message)
        self.assertEqual(self.stored_files(), [])
        self.assertEqual(self.store.list(), [])

    def test_hostile_name_reads_nothing(self) -> None:
        source = io.BytesIO(tiny_gguf(self.home))
        self.failureResultOf(self.store.import_gguf("../../etc", source), BadRequest)
        self.assertEqual(source.tell(), 0)
        self.assertEqual(self.stored_files(), [])

    def test_digest_name_rejected(self) -> None:
        name = "ai/x@sha256:" + "0" * 64
        self.failureResultOf(self.store.import_gguf(name, io.BytesIO(b"")), BadRequest)

    def test_reimport_moves_the_tag(self) -> None:
        old = self.import_model("x")
        new = self.import_model("x", seed=1)
        self.assertEqual(self.store.resolve("x"), new)
        self.assertEqual(self.store.resolve(old.id).tags, ())

    def test_stale_temps_are_not_blobs(self) -> None:
        model = self.import_model("x")
        blobs = self.home / "models" / "blobs" / "sha256"
        (blobs / ("ab" * 32 + ".incomplete")).write_bytes(b"partial")
        (blobs / "import-123.incomplete").write_bytes(b"partial")
        store = ModelStore(self.home, self.clock)
        self.assertFalse((blobs / "import-123.incomplete").exists())
        self.assertNotIn("sha256:" + "ab" * 32, set(store.blobs.digests()))
        self.assertRaises(NotFound, store.resolve, "ab" * 32)
        self.assertEqual(store.list(), [model])

    def test_disk_usage(self) -> None:
        self.assertEqual(self.store.disk_usage(), 0)
        model = self.import_model("x")
        self.assertGreater(self.store.disk_usage(), os.path.getsize(model.gguf))


class ResolveTests(StoreTestCase):
    def test_unknown(self) -> None:
        error = self.assertRaises(NotFound, self.store.resolve, "nothing")
        self.assertIn("ai/nothing:latest", error.message)
        self.assertRaises(NotFound, self.store.resolve, "sha256:" + "0" * 64)

    def test_hostile(self) -> None:
        self.assertRaises(BadRequest, self.store.resolve, "../x")

    def test_digest_reference(self) -> None:
        model = self.import_model("x")
        self.assertEqual(self.store.resolve(f"ai/x@{model.id}"), model)

    def test_short_id_that_is_also_a_name(self) -> None:
        named = self.import_model("abcdef123456")
        self.assertEqual(self.store.resolve("abcdef123456"), named)

    def test_a_name_found_follows_every_change_of_the_tags(self) -> None:
        """Names found are remembered (L{Index.lookup}) only until the tags change."""
        old = self.import_model("x")
        for name in ("x", "ai/x:latest", old.short_id):
            self.assertEqual(self.store.resolve(name), old)
        new = self.import_model("x", seed=1)
        self.assertEqual(self.store.resolve("x"), new)
        self.assertEqual(self.store.resolve("ai/x:latest"), new)
        self.store.tag(old.short_id, "y")
        self.assertEqual(self.store.resolve("y").id, old.id)
        self.store.delete("y")
        for name in ("y", old.short_id):
            self.assertRaises(NotFound, self.store.resolve, name)


class TagDeleteTests(StoreTestCase):
    def test_tag(self) -> None:
        model = self.import_model("x")
        tagged = self.store.tag("x", "myorg/y:v1")
        self.assertEqual(tagged.tags, ("ai/x:latest", "myorg/y:v1"))
        self.assertEqual(self.store.resolve("myorg/y:v1").id, model.id)
        self.assertRaises(BadRequest, self.store.tag, "x", "bad name")
        self.assertRaises(NotFound, self.store.tag, "nothing", "y")

    def test_delete_removes_unshared_blobs(self) -> None:
        model = self.import_model("x")
        self.assertEqual(self.store.delete("x"), [{"Untagged": "ai/x:latest"}, {"Deleted": model.id}])
        self.assertEqual(self.stored_files(), [])
        self.assertRaises(NotFound, self.store.resolve, "x")

    def test_delete_keeps_shared_blobs(self) -> None:
        first = self.import_model("x")
        self.clock.advance(1)  # a different created time: a different config and manifest
        second = self.import_model("y")
        self.assertNotEqual(first.id, second.id)
        self.store.delete("x")
        self.assertTrue(Path(second.gguf).exists())
        self.assertEqual(self.store.resolve("y"), second)

    def test_deleting_one_of_several_tags_removes_that_tag_only(self) -> None:
        """As C{docker rmi}: the model stays while another name holds it, C{force} or not."""
        model = self.import_model("x")
        self.store.tag("x", "y")
        self.store.tag("x", "z")
        self.assertEqual(self.store.delete("x"), [{"Untagged": "ai/x:latest"}])
        self.assertEqual(self.store.delete("y", force=True), [{"Untagged": "ai/y:latest"}])
        self.assertRaises(NotFound, self.store.resolve, "x")
        self.assertEqual(self.store.resolve("z").tags, ("ai/z:latest",))
        self.assertTrue(Path(model.gguf).exists())
        self.assertEqual(self.store.delete("z"), [{"Untagged": "ai/z:latest"}, {"Deleted": model.id}])
        self.assertEqual(self.stored_files(), [])

    def test_deleting_by_id_under_several_tags_needs_force(self) -> None:
        model = self.import_model("x")
        self.store.tag("x", "y")
        for name in (model.id, model.short_id):
            error = self.assertRaises(Conflict, self.store.delete, name)
            self.assertIn("force", error.message)
        self.assertEqual(self.store.resolve("y").id, model.id)
        result = self.store.delete(model.short_id, force=True)
        self.assertEqual(result[-1], {"Deleted": model.id})
        self.assertRaises(NotFound, self.store.resolve, "y")

    def test_a_missing_name_suggests_the_nearest_stored_one(self) -> None:
        self.import_model("smollm2")
        error = self.assertRaises(NotFound, self.store.resolve, "ai/smolm2")
        self.assertIn("(did you mean ai/smollm2:latest?)", error.message)
        error = self.assertRaises(NotFound, self.store.resolve, "qwen3")
        self.assertNotIn("did you mean", error.message)

    def test_blobs_a_pull_keeps_survive_collection(self) -> None:
        model = self.import_model("x")
        with self.store.keeping(["sha256:" + Path(model.gguf).name]):
            self.store.delete("x")
            self.assertTrue(Path(model.gguf).exists())
        self.import_model("other", seed=3)
        self.store.delete("other")
        self.assertFalse(Path(model.gguf).exists())
