"""A backend defined in the config by its command line, as llama-swap defines models.

``[backends.NAME] command = ["my-server", "--model", "{model}", "--socket", "{socket}"]``;
placeholders: {model} (GGUF path), {socket}, {alias}, {mode}, {ctx_size}, {parallel},
{threads}. Its server must listen on the UNIX socket and answer ``GET /health``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from zope.interface import implementer

from mrunner.interfaces import IBackend
from mrunner.values import ContextSize, Footprint
from mrunner.values.backend import Command, RunnerSettings
from mrunner.values.model import Model


@implementer(IBackend)
class CommandBackend:
    """Runs whatever command the config names; installing it means finding it."""

    manages_models = False

    def __init__(self, name: str, command: Sequence[str], env: dict[str, str] | None = None):
        if isinstance(command, str) or not command or not all(isinstance(part, str) for part in command):
            raise ValueError(f"backends.{name}.command must be a non-empty list of strings")
        self.name = name
        self._command = tuple(command)
        self._env = env

    def install(self, report: Callable[[str], None]) -> Deferred[str]:
        executable = shutil.which(self._command[0])
        if executable is None:
            return fail(FileNotFoundError(f"{self._command[0]} not found (backends.{self.name}.command)"))
        return succeed(f"{self.name} ({executable})")

    def command(self, model: Model, mode: str, socket: str, settings: RunnerSettings) -> Command:
        values: dict[str, Any] = {
            "model": model.gguf,
            "socket": socket,
            "alias": model.name,
            "mode": mode,
            "ctx_size": settings.context_size or "",
            "parallel": settings.parallel,
            "threads": settings.threads,
        }
        args = [part.format(**values) for part in self._command]
        return Command(shutil.which(args[0]) or args[0], (*args[1:], *settings.flags), self._env)

    def memory(self, model: Model, mode: str, settings: RunnerSettings) -> int:
        """Only the weights are known of an arbitrary server."""
        return sum(os.path.getsize(path) for path in model.weights)

    def footprint(self, model: Model, mode: str, settings: RunnerSettings) -> Footprint:
        """An arbitrary server is not told where to put layers: it all counts in RAM."""
        return Footprint(self.memory(model, mode, settings))

    def context(self, model: Model, settings: RunnerSettings) -> ContextSize:
        """An arbitrary server's context is what it is told, if anything."""
        return ContextSize(settings.context_size, settings.context_size)

    def disk_usage(self) -> int:
        return 0

    def uninstall(self) -> Deferred[None]:
        return succeed(None)
