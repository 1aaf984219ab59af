"""The mrunner command with Whisper models and the real whisper-server: package, ls, inspect,
transcribe (text and SRT), ps (mode transcription), unload, rm; a GGUF given as a Whisper model."""

from __future__ import annotations

import json

from mrunner.testing import tinywhisper
from tests.support.cli_cases import CLITestCase
from tests.support.whisper_cases import cached_whisper_server, speech

NAME = "ai/whisper-tiny:latest"


class WhisperCLITests(CLITestCase):
    timeout = 120

    async def test_package_transcribe_and_remove(self) -> None:
        cached_whisper_server()
        wav = speech(self.home / "hello.wav")
        model = self.home / "ggml-tiny-random.bin"
        tinywhisper.write(model)
        packaged = await self.ok("package", "--whisper", str(model), NAME)
        self.assertIn(f"as {NAME}", packaged)
        self.assertIn("whisper", await self.ok("ls"))
        inspected = json.loads(await self.ok("inspect", NAME))
        self.assertEqual(inspected["config"]["format"], "whisper")
        text = await self.ok("transcribe", str(wav), "--model", NAME)
        self.assertTrue(text.strip())
        srt = await self.ok("transcribe", str(wav), "--model", NAME, "--format", "srt")
        self.assertRegex(srt, r"^1\n\d\d:\d\d:\d\d,\d\d\d --> ")
        self.assertIn("transcription", await self.ok("ps"))
        status = await self.ok("status")
        self.assertIn("whisper.cpp: installed (whisper.cpp v1.8.5-mr3), 1 runner running", status)
        await self.ok("unload", NAME)
        await self.ok("rm", NAME)
        self.assertNotIn("whisper", await self.ok("ls"))

    async def test_a_gguf_as_a_whisper_model_is_refused_naming_it(self) -> None:
        said = await self.fails("package", "--whisper", str(self.gguf), NAME)
        self.assertIn("GGUF", said)

    async def test_not_audio_is_refused(self) -> None:
        cached_whisper_server()
        model = self.home / "ggml-tiny-random.bin"
        tinywhisper.write(model)
        await self.ok("package", "--gguf", str(model), NAME)  # the format is detected
        said = await self.fails("transcribe", str(self.gguf), "--model", NAME)
        self.assertIn("GGUF", said)
