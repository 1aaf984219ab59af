"""Other tools' models found and imported as hard links: Ollama's store, the Hugging Face cache, LM Studio's
folder, llama.cpp's cache and a plain path, laid out as those tools write them; hostile layouts refused."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from mrunner.config import SourcesConfig
from mrunner.errors import BadRequest, NotFound
from mrunner.store.artifact import GGUF, LICENSE, MMPROJ
from mrunner.store.sources import catalog, hf_cache, linking, llamacpp, lmstudio, ollama
from mrunner.store.sources.found import Refused
from mrunner.testing.tinymodel import write_tiny_mmproj
from tests.support.ggufs import flip_last_byte, write_tiny_gguf
from tests.support.store_cases import StoreTestCase
from tests.support.tool_folders import (
    hf_cache_repo,
    lmstudio_repo,
    ollama_blob,
    ollama_blob_path,
    ollama_model,
    sha256,
)


class SourcesTestCase(StoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tools = Path(self.mktemp()).absolute()
        self.roots = {name: self.tools / name for name in catalog.MODULES}
        for root in self.roots.values():
            root.mkdir(parents=True)
        self.sources = catalog.Sources(self.roots, self.store)
        self.gguf = self.tools / "tiny-Q4_1.gguf"
        write_tiny_gguf(self.gguf, seed=1)

    def listing(self) -> list[dict[str, Any]]:
        return self.successResultOf(self.sources.listing())  # type: ignore[arg-type]

    def import_(self, ref: str, name: str | None = None) -> tuple[Any, dict[str, Any]]:
        return self.successResultOf(self.sources.import_(ref, name))  # type: ignore[arg-type]

    def refused(self, ref: str, error: type[Exception] = Refused) -> str:
        failure = self.failureResultOf(self.sources.import_(ref, None), error)  # type: ignore[arg-type]
        self.assertEqual(self.store.list(), [])
        self.assertEqual(self.stored_files(), [], "nothing half-made is left in the store")
        return str(failure.value)

    def assertLinked(self, stored: str, source: Path) -> None:
        self.assertEqual(os.stat(stored).st_ino, os.stat(source).st_ino)


class OllamaTests(SourcesTestCase):
    def test_listed_with_its_header(self) -> None:
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        (found,) = self.listing()
        self.assertEqual(found["source"], "ollama")
        self.assertEqual(found["ref"], "ollama:tiny:1b")
        self.assertEqual(found["name"], "ollama.com/library/tiny:1b")
        self.assertEqual(found["quantization"], "Q4_1")
        self.assertEqual(found["size"], self.gguf.stat().st_size)
        self.assertEqual(found["in_store"], [])

    def test_imported_as_a_hard_link_with_its_projector_and_license(self) -> None:
        projector = self.tools / "mmproj.gguf"
        write_tiny_mmproj(projector)
        ollama_model(self.roots["ollama"], "tiny", "latest", self.gguf, projector)
        model, report = self.import_("ollama:tiny")
        self.assertEqual(model.tags, ("ollama.com/library/tiny:latest",))
        blob = ollama_blob_path(self.roots["ollama"], self.gguf.read_bytes())
        self.assertLinked(model.gguf, blob)
        self.assertLinked(
            model.files["mmproj"], ollama_blob_path(self.roots["ollama"], projector.read_bytes())
        )
        self.assertEqual(Path(model.files["license"]).read_bytes(), b"tiny license")
        kinds = [layer.media_type for layer in self.store.manifest(model.id).layers]
        self.assertEqual(kinds, [GGUF, LICENSE, MMPROJ])
        self.assertEqual(report["linked"], 3)
        self.assertEqual(report["copied_bytes"], 0)
        self.assertIn("Go template", " ".join(report["notes"]))
        self.assertIn(ollama.NO_TEMPLATE, report["notes"])
        self.assertEqual(self.listing()[0]["in_store"], ["ollama.com/library/tiny:latest"])

    def test_removed_from_the_store_the_source_is_untouched(self) -> None:
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        model, _ = self.import_("ollama:library/tiny:1b", "mine")
        self.store.delete("mine")
        self.assertEqual(self.store.list(), [])
        self.assertFalse(os.path.exists(model.gguf))
        self.assertEqual(
            ollama_blob_path(self.roots["ollama"], self.gguf.read_bytes()).read_bytes(),
            self.gguf.read_bytes(),
        )

    def test_a_source_changed_in_place_is_found_by_verify(self) -> None:
        """The tool's file and the store's blob are one file: a change to it is the store's to find."""
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        model, _ = self.import_("ollama:tiny:1b")
        flip_last_byte(ollama_blob_path(self.roots["ollama"], self.gguf.read_bytes()))
        (report,) = self.successResultOf(self.store.verify(model.id))  # type: ignore[arg-type]
        self.assertEqual(report["status"], "corrupt")

    def test_a_source_removed_after_import_leaves_the_model_whole(self) -> None:
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        model, _ = self.import_("ollama:tiny:1b")
        ollama_blob_path(self.roots["ollama"], self.gguf.read_bytes()).unlink()
        (report,) = self.successResultOf(self.store.verify(model.id))  # type: ignore[arg-type]
        self.assertEqual(report["status"], "ok")

    def test_copied_where_the_file_system_refuses_a_link(self) -> None:
        def cross_device(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        self.patch(linking.os, "link", cross_device)
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        model, report = self.import_("ollama:tiny:1b")
        self.assertNotEqual(
            os.stat(model.gguf).st_ino,
            os.stat(ollama_blob_path(self.roots["ollama"], self.gguf.read_bytes())).st_ino,
        )
        self.assertEqual(report["linked"], 0)
        self.assertGreaterEqual(report["copied_bytes"], self.gguf.stat().st_size)
        self.assertIn("copied", report["message"])

    def test_a_blob_whose_digest_lies_is_refused(self) -> None:
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        blob = ollama_blob_path(self.roots["ollama"], self.gguf.read_bytes())
        data = bytearray(blob.read_bytes())
        data[-1] ^= 1
        blob.write_bytes(bytes(data))
        self.assertIn("hashes to", self.refused("ollama:tiny:1b"))
        self.assertEqual(blob.read_bytes(), bytes(data), "the source is left as it was")

    def test_a_manifest_naming_a_blob_outside_the_store_is_refused(self) -> None:
        outside = {"mediaType": ollama.MODEL, "digest": "sha256:../../../etc/passwd", "size": 10}
        manifest = ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        value = json.loads(manifest.read_text())
        value["layers"][0] = outside
        manifest.write_text(json.dumps(value))
        self.assertIn("not a sha256 digest", self.refused("ollama:tiny:1b"))
        self.assertIn("problem", self.listing()[0])

    def test_a_blob_linking_out_of_the_store_is_refused(self) -> None:
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        blob = ollama_blob_path(self.roots["ollama"], self.gguf.read_bytes())
        blob.unlink()
        blob.symlink_to(self.gguf)
        self.assertIn("outside", self.refused("ollama:tiny:1b"))

    def test_an_adapter_is_refused(self) -> None:
        adapter = {
            "mediaType": ollama.ADAPTER,
            "digest": ollama_blob(self.roots["ollama"], b"lora"),
            "size": 4,
        }
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf, extra_layers=[adapter])
        self.assertIn("adapter", self.refused("ollama:tiny:1b"))

    def test_unknown_names(self) -> None:
        ollama_model(self.roots["ollama"], "tiny", "1b", self.gguf)
        self.assertIn("ls --found", self.refused("ollama:other:1b", NotFound))
        self.refused("ollama:tiny", NotFound)  # no latest tag
        self.refused("docker:tiny", BadRequest)


class HuggingFaceCacheTests(SourcesTestCase):
    def test_listed_and_imported_as_a_link_to_the_blob(self) -> None:
        other = self.tools / "tiny-F16.gguf"
        write_tiny_gguf(other, seed=2)
        snapshot = hf_cache_repo(
            self.roots["hf-cache"], "Org/Tiny-GGUF", {"tiny-Q4_1.gguf": self.gguf, "tiny-F16.gguf": other}
        )
        refs = sorted(found["ref"] for found in self.listing())
        self.assertEqual(refs, ["hf-cache:Org/Tiny-GGUF:F16", "hf-cache:Org/Tiny-GGUF:Q4_1"])
        self.assertIn("2 models", self.refused("hf-cache:org/tiny-gguf", BadRequest))
        model, report = self.import_("hf-cache:org/tiny-gguf:q4_1")
        self.assertEqual(model.tags, ("hf.co/org/tiny-gguf:Q4_1",))
        self.assertLinked(model.gguf, (snapshot / "tiny-Q4_1.gguf").resolve())
        self.assertEqual(report["linked"], 1)

    def test_a_split_model_in_a_folder_of_the_snapshot(self) -> None:
        write_tiny_gguf(self.tools / "big.gguf", shards=True)
        shards = {
            f"Q4_1/big-Q4_1-0000{n}-of-00002.gguf": self.tools / f"big-0000{n}-of-00002.gguf" for n in (1, 2)
        }
        hf_cache_repo(self.roots["hf-cache"], "org/big", shards)
        model, _ = self.import_("hf-cache:org/big")
        self.assertEqual(len(model.shards), 2)

    def test_a_link_out_of_the_cache_is_refused(self) -> None:
        snapshot = hf_cache_repo(self.roots["hf-cache"], "org/tiny", {"tiny-Q4_1.gguf": self.gguf})
        (snapshot / "tiny-Q4_1.gguf").unlink()
        (snapshot / "tiny-Q4_1.gguf").symlink_to(self.gguf)
        self.assertIn("outside", self.refused("hf-cache:org/tiny:Q4_1"))

    def test_a_blob_whose_name_is_not_its_digest_is_refused(self) -> None:
        snapshot = hf_cache_repo(self.roots["hf-cache"], "org/tiny", {"tiny-Q4_1.gguf": self.gguf})
        blob = (snapshot / "tiny-Q4_1.gguf").resolve()
        write_tiny_gguf(blob, seed=9)
        self.assertIn("hashes to", self.refused("hf-cache:org/tiny"))


class FolderTests(SourcesTestCase):
    def test_lmstudio_with_a_projector(self) -> None:
        projector = self.tools / "mmproj-tiny-f16.gguf"
        write_tiny_mmproj(projector)
        folder = lmstudio_repo(
            self.roots["lmstudio"], "pub/Tiny-GGUF", {"Tiny-Q4_1.gguf": self.gguf, projector.name: projector}
        )
        (found,) = self.listing()
        self.assertEqual((found["ref"], found["projector"]), ("lmstudio:pub/Tiny-GGUF:Q4_1", True))
        model, _ = self.import_("lmstudio:pub/tiny-gguf")
        self.assertEqual(model.tags, ("lmstudio/pub/tiny-gguf:Q4_1",))
        self.assertLinked(model.gguf, folder / "Tiny-Q4_1.gguf")
        self.assertLinked(model.files["mmproj"], folder / projector.name)

    def test_llamacpp_cache(self) -> None:
        (self.roots["llama.cpp"] / "org_tiny_tiny-Q4_1.gguf").write_bytes(self.gguf.read_bytes())
        (found,) = self.listing()
        self.assertEqual(found["ref"], "llama.cpp:org_tiny_tiny-Q4_1")
        model, _ = self.import_(found["ref"])
        self.assertLinked(model.gguf, self.roots["llama.cpp"] / "org_tiny_tiny-Q4_1.gguf")

    def test_a_path(self) -> None:
        self.refused(str(self.tools / "missing.gguf"))
        self.refused("/etc/passwd", BadRequest)
        model, _ = self.import_(str(self.gguf), "tiny")
        self.assertEqual(model.tags, ("ai/tiny:latest",))
        self.assertLinked(model.gguf, self.gguf)
        self.assertEqual(self.listing(), [])

    def test_marked_in_store_by_inode_when_imported_by_path(self) -> None:
        folder = lmstudio_repo(self.roots["lmstudio"], "pub/tiny", {"tiny-Q4_1.gguf": self.gguf})
        self.import_(str(folder / "tiny-Q4_1.gguf"), "mine")
        self.assertEqual(self.listing()[0]["in_store"], ["ai/mine:latest"])


class RootTests(StoreTestCase):
    def test_each_tool_s_variables_as_it_reads_them(self) -> None:
        home = str(Path("~").expanduser())
        self.assertEqual(ollama.root(None, {"OLLAMA_MODELS": "/o"}), Path("/o"))
        self.assertEqual(ollama.root(None, {}), Path(home, ".ollama/models"))
        self.assertEqual(hf_cache.root(None, {"HF_HUB_CACHE": "/h", "HF_HOME": "/x"}), Path("/h"))
        self.assertEqual(hf_cache.root(None, {"HF_HOME": "/x"}), Path("/x/hub"))
        self.assertEqual(hf_cache.root(None, {"XDG_CACHE_HOME": "/c"}), Path("/c/huggingface/hub"))
        self.assertEqual(llamacpp.root(None, {"LLAMA_CACHE": "/l"}), Path("/l"))
        self.assertEqual(lmstudio.root("/m", {}), Path("/m"))

    def test_tap_conf_wins_and_empty_turns_a_source_off(self) -> None:
        config = SourcesConfig(ollama="/conf", huggingface="")
        sources = catalog.Sources.configured(config, {"OLLAMA_MODELS": "/env", "HF_HOME": "/x"}, self.store)
        self.assertEqual(sources.roots["ollama"], Path("/conf"))
        self.assertIsNone(sources.roots["hf-cache"])
        self.assertEqual(sha256(b"")[:7], "sha256:")
