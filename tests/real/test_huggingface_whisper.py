"""whisper.cpp's models pulled from a Hugging Face repository shaped like hf.co/ggerganov/whisper.cpp,
the stand-in Hub serving them: the file a tag names, the default, and what is not a model."""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import BadRequest, NotFound
from mrunner.store import artifact, hub_whisper
from mrunner.store.huggingface import HubFile
from mrunner.testing import tinywhisper
from tests.support.hub_cases import HubTestCase
from tests.support.hub_server import Repo


def listed(*paths: str) -> list[HubFile]:
    return [HubFile(path, 1, "0" * 64) for path in paths]


class SelectTests(SynchronousTestCase):
    FILES = listed(
        "ggml-tiny.en.bin",
        "ggml-base.bin",
        "ggml-large-v3-turbo-q5_0.bin",
        "for-tests-ggml-tiny.bin",
        "ggml-silero-v5.1.2.bin",
        "ggml-base-encoder.mlmodelc.zip",
        "README.md",
    )

    def test_the_tag_names_the_file(self) -> None:
        self.assertEqual(hub_whisper.select("r", self.FILES, "tiny.en").path, "ggml-tiny.en.bin")  # type: ignore[union-attr]
        self.assertEqual(
            hub_whisper.select("r", self.FILES, "LARGE-v3-turbo-q5_0").path, "ggml-large-v3-turbo-q5_0.bin"
        )  # type: ignore[union-attr]
        self.assertEqual(hub_whisper.select("r", self.FILES, None).path, "ggml-base.bin")  # type: ignore[union-attr]
        self.assertEqual(sorted(hub_whisper.models(self.FILES)), ["base", "large-v3-turbo-q5_0", "tiny.en"])

    def test_refusals(self) -> None:
        self.assertRaises(NotFound, hub_whisper.select, "r", self.FILES, "huge")
        self.assertRaises(BadRequest, hub_whisper.select, "r", listed("ggml-a.bin", "ggml-b.bin"), None)
        self.assertIsNone(hub_whisper.select("r", listed("x-Q4_K_M.gguf"), None))


class WhisperHubTests(HubTestCase):
    async def test_a_whisper_model_is_pulled_by_its_tag(self) -> None:
        path = Path(self.mktemp())
        tinywhisper.write(path)
        data = path.read_bytes()
        self.hub.add(
            "team/whisper.cpp", Repo({"ggml-tiny.bin": data, "ggml-base.bin": data, "README.md": b"#"})
        )
        model = await self.pull(self.puller(), "hf.co/team/whisper.cpp:tiny")
        self.assertEqual(model.tags, ("hf.co/team/whisper.cpp:tiny",))
        manifest = self.store.manifest(model.id)
        self.assertEqual([layer.media_type for layer in manifest.layers], [artifact.WHISPER])
        self.assertEqual(Path(model.gguf).read_bytes(), data)
        self.assertEqual(model.config["format"], "whisper")

    async def test_a_bin_that_is_not_whisper_is_refused_and_removed(self) -> None:
        self.hub.add("team/fake-whisper", Repo({"ggml-base.bin": self.weights["Q8_0"]}))
        with self.assertRaises(BadRequest) as refused:
            await self.pull(self.puller(), "hf.co/team/fake-whisper")
        self.assertIn("GGUF", refused.exception.message)
        self.assertEqual(self.store.list(), [])
