"""Whisper models in the store: detected by their magic or a package's .bin, read for their facts,
and a file given as one that is not one refused with what it is."""

from __future__ import annotations

import io

from mrunner.errors import BadRequest
from mrunner.store import whisper_meta
from mrunner.store.artifact import WHISPER, parse_manifest
from mrunner.testing import tinywhisper
from tests.support.ggufs import package
from tests.support.store_cases import StoreTestCase, tiny_gguf


class WhisperStoreTests(StoreTestCase):
    def whisper(self) -> bytes:
        path = self.home.parent / "tiny-whisper.bin"
        tinywhisper.write(path)
        return path.read_bytes()

    def test_a_whisper_file_is_detected_and_described(self) -> None:
        model = self.successResultOf(self.store.import_gguf("ai/whisper:tiny", io.BytesIO(self.whisper())))
        config = model.config
        self.assertEqual((config["format"], config["quantization"]), ("whisper", "F16"))
        self.assertEqual(config["whisper"]["n_vocab"], tinywhisper.VOCAB)
        self.assertEqual(config["whisper"]["languages"], "multilingual")
        self.assertEqual(config["parameters"], "3.59 M")
        manifest = parse_manifest(self.store.manifest_bytes(model.id))
        self.assertEqual([layer.media_type for layer in manifest.layers], [WHISPER])
        (report,) = self.successResultOf(self.store.verify())
        self.assertEqual(report["status"], "ok")

    def test_a_package_of_a_whisper_model_and_its_license(self) -> None:
        data = package([("model.bin", self.whisper()), ("licenses/0-LICENSE", b"MIT\n")])
        model = self.successResultOf(self.store.import_package("ai/whisper:tiny", io.BytesIO(data)))
        self.assertEqual(model.config["format"], "whisper")
        self.assertIn("license", model.files)

    def test_a_package_whose_bin_is_not_whisper_names_what_it_is(self) -> None:
        data = package([("model.bin", tiny_gguf(self.home, 0))])
        failure = self.failureResultOf(
            self.store.import_package("ai/whisper:x", io.BytesIO(data)), BadRequest
        )
        self.assertIn("a GGUF file", failure.value.message)
        self.assertEqual(failure.value.status, 400)
        self.assertEqual(self.stored_files(), [])

    def test_whisper_and_gguf_weights_together_are_refused(self) -> None:
        data = package([("model.bin", self.whisper()), ("model.gguf", tiny_gguf(self.home, 0))])
        failure = self.failureResultOf(self.store.import_package("ai/x:y", io.BytesIO(data)), BadRequest)
        self.assertIn("1 .bin file(s)", failure.value.message)

    def test_a_cut_short_model_is_refused(self) -> None:
        data = package([("model.bin", self.whisper()[:100_000])])
        failure = self.failureResultOf(self.store.import_package("ai/x:y", io.BytesIO(data)), BadRequest)
        self.assertIn("cut short", failure.value.message)


class WhatTests(StoreTestCase):
    def test_other_files_are_named(self) -> None:
        self.assertIn("GGUF", whisper_meta.what(b"GGUF\x03\x00\x00\x00"))
        self.assertIn("ZIP", whisper_meta.what(b"PK\x03\x04rest"))
        self.assertIn("safetensors", whisper_meta.what((100).to_bytes(8, "little") + b'{"a":1}'))
        self.assertEqual(whisper_meta.what(b""), "empty")
        self.assertEqual(whisper_meta.what(b"junk"), "not a whisper.cpp ggml model")
