"""The whisper.cpp backend as an L{IBackend}: find or build the ``whisper-server`` it uses
(L{BuiltBackend}), and start one for a Whisper model, one process per model, on a UNIX socket."""

from __future__ import annotations

import os
from pathlib import Path

from zope.interface import implementer

from mrunner.backends import build
from mrunner.backends.built import BuiltBackend
from mrunner.backends.whispercpp.source import PIN, SOURCE
from mrunner.errors import BadRequest
from mrunner.interfaces import IBackend
from mrunner.values import ContextSize, Footprint
from mrunner.values.backend import TRANSCRIPTION, Command, RunnerSettings
from mrunner.values.model import Model

#: What a runner holds beside its weights, measured with whisper.cpp v1.8.5 on the CPU: the KV caches
#: (under 40 MiB for large-v3), the compute buffers (about 100 MiB, most of it the decoder's, for any
#: size) and the process itself.
OVERHEAD = 192 * 1024 * 1024
#: The port whisper-server is given beside its socket path: it binds the socket, and the number is
#: unused, but it must not be 0 (cpp-httplib then asks the socket for a TCP port, and fails).
UNUSED_PORT = "1"


@implementer(IBackend)
class WhisperCppBackend(BuiltBackend):
    """whisper.cpp's ``whisper-server``: transcription and translation of audio, OpenAI's way."""

    name = "whisper.cpp"
    source = SOURCE
    installer = "mrunner.backends.whispercpp"

    async def version(self, path: Path) -> str:
        """C{whisper.cpp <pin>} once C{path} ``--help`` runs (whisper-server prints no version)."""
        await build.probe(self._reactor, "whisper-server", path, "--help")
        return f"{self.name} {PIN}"

    async def found(self, version: str) -> str:
        return version if self.variant == "cpu" else f"{version} ({self.variant})"

    def command(self, model: Model, mode: str, socket: str, settings: RunnerSettings) -> Command:
        """``whisper-server -m MODEL --host SOCKET``: it serves C{/inference} and C{/health} there."""
        if model.config.get("format") != "whisper" or mode != TRANSCRIPTION:
            raise BadRequest(
                f"whisper.cpp transcribes with Whisper models; {model.name} is not one, or {mode} is not"
                " transcription",
                code="model_not_whisper",
            )
        if settings.flags:
            # _configure checks runtime flags against llama-server's parser, not whisper-server's.
            raise BadRequest(
                f"{model.name} has runtime flags ({' '.join(settings.flags)}); whisper.cpp runners take none:"
                " configure it again without them",
                code="flags_not_supported",
            )
        args = ["-m", model.gguf, "--host", socket, "--port", UNUSED_PORT]
        if settings.threads:
            args += ["--threads", str(settings.threads)]
        if self.variant == "cpu":
            args.append("--no-gpu")
        return Command(self.running(), tuple(args))

    def memory(self, model: Model, mode: str, settings: RunnerSettings) -> int:
        """The weights, held whole in memory, and L{OVERHEAD}."""
        return sum(os.path.getsize(path) for path in model.weights) + OVERHEAD

    def footprint(self, model: Model, mode: str, settings: RunnerSettings) -> Footprint:
        """No layers are placed: whisper-server keeps the model on one device, counted in RAM."""
        return Footprint(self.memory(model, mode, settings))

    def context(self, model: Model, settings: RunnerSettings) -> ContextSize:
        """A Whisper model has no context to choose: its windows are 30 seconds."""
        return ContextSize()
