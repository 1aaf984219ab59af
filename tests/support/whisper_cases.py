"""The base of the tests that run real whisper-server through mrunner: the pinned build, speech from
espeak-ng, and a tiny random-weight Whisper model in the store (no package on the index ships a
real one in whisper.cpp's format, so these tests check the path and the answer's shape)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
from twisted.trial.unittest import SkipTest

from mrunner.backends.whispercpp.source import cached_executable
from mrunner.testing import tinywhisper
from tests.support.llamacpp_cases import LlamaCppTestCase

WHISPER = "ai/whisper-tiny:latest"
SENTENCE = "Hello world. This is a test of speech recognition through the model runner."


def cached_whisper_server() -> Path:
    """The pinned whisper-server in the shared cache, or skip the test that needs it."""
    executable = cached_executable()
    if not executable.is_file():
        raise SkipTest(f"no {executable}: run python -m mrunner.backends.whispercpp")
    return executable


def speech(path: Path, text: str = SENTENCE) -> Path:
    """C{text} spoken by espeak-ng into the WAV file C{path} (22 050 Hz mono, as espeak-ng writes it)."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise SkipTest("no espeak-ng: make system-deps installs it")
    subprocess.run([espeak, "-w", str(path), text], check=True, capture_output=True)
    return path


class WhisperTestCase(LlamaCppTestCase):
    async def start_whisper(self, config_text: str = "") -> None:
        cached_whisper_server()
        await self.start(config_text)
        model = self.home / "ggml-tiny-random.bin"
        tinywhisper.write(model)
        await self.daemon.import_model(WHISPER, model)
        self.wav = speech(self.home / "hello.wav")

    def form(self, path: str, files: dict[str, Any], **fields: Any) -> Any:
        """POST a multipart form to the daemon (in a thread: httpx blocks); the httpx response."""
        with httpx.Client(base_url=self.daemon.url, timeout=120) as client:
            return client.post(path, files=files, data=fields)

    def posted(self, path: str, data: bytes, name: str = "a.wav", **fields: Any) -> Any:
        return self.call(self.form, path, {"file": (name, data)}, **fields)
