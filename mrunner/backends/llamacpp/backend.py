"""The llama.cpp backend as an L{IBackend}: choose, find or build the ``llama-server`` it uses
(L{BuiltBackend}), and start one for a model (L{arguments}) with a memory estimate (L{sizing})."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from zope.interface import implementer

from mrunner.backends.built import BuiltBackend
from mrunner.backends.llamacpp import arguments, probes, sizing
from mrunner.backends.llamacpp.source import SOURCE
from mrunner.config import Config
from mrunner.devices import listing
from mrunner.devices.listing import Listed
from mrunner.interfaces import IBackend
from mrunner.values import ContextSize, Footprint
from mrunner.values.backend import Command, RunnerSettings
from mrunner.values.model import Model


@implementer(IBackend)
class LlamaCppBackend(BuiltBackend):
    """llama.cpp's ``llama-server``, one process per (model, mode), on a UNIX socket."""

    name = "llama.cpp"
    source = SOURCE
    installer = "mrunner.backends.llamacpp"

    def __init__(
        self, config: Config, reactor: Any, environ: Mapping[str, str] = os.environ, fallback: bool = True
    ):
        super().__init__(config, reactor, environ, fallback)
        #: The prompt cache's folder (C{--slot-save-path}), None with [cache] off; llama-server's RAM cache.
        self._slot_states = config.cache.path(config.home) if config.cache.enabled else None
        self._cache_ram = config.cache.runner_ram
        self._listed: list[Listed] = []

    async def version(self, path: Path) -> str:
        return await probes.version(self._reactor, path, self.name)

    async def found(self, version: str) -> str:
        """Ask the installed build for its devices; a build we did not make is of the variant it lists.

        Our own CPU build lists none, so it is not asked (a CPU machine starts as it always did).
        """
        ours = self._installed is not None and self._installed.directory is not None
        if ours and self.variant == "cpu":
            return version
        self._listed = await self.list_devices()
        if not ours:
            self.variant = listing.variant_of(self._listed)
        return version if self.variant == "cpu" else f"{version} ({self.variant})"

    def listed(self) -> list[Listed]:
        """The GPUs the installed build listed last; none before install()."""
        return list(self._listed)

    def list_devices(self) -> Deferred[list[Listed]]:
        """Run ``llama-server --list-devices``: the GPUs it prints; none (and a warning) if it fails or
        prints something else."""
        return Deferred.fromCoroutine(self._list_devices())

    async def _list_devices(self) -> list[Listed]:
        if self._installed is None:
            return []
        self._listed = await probes.devices(self._reactor, self._installed.executable)
        return self.listed()

    def command(self, model: Model, mode: str, socket: str, settings: RunnerSettings) -> Command:
        """The installed ``llama-server``'s command line for C{model}, as L{arguments.command} writes it."""
        states, ram = self._slot_states_folder(), self._cache_ram
        return arguments.command(self.running(), model, mode, socket, settings, states, ram)

    def _slot_states_folder(self) -> Path | None:
        """The prompt cache's folder, made again if it was removed (llama-server refuses to start
        with a --slot-save-path that is no directory); None, so no slot is saved, if it cannot be."""
        if self._slot_states is None:
            return None
        try:
            self._slot_states.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            self.log.warn("prompt cache folder {path}: {why}; slots not saved", path=self._slot_states, why=e)
            return None
        return self._slot_states

    def memory(self, model: Model, mode: str, settings: RunnerSettings) -> int:
        """L{sizing.memory_estimate}, and llama-server's prompt cache in RAM ([cache] runner_ram)."""
        return sizing.memory_estimate(model, settings) + self._cache_ram

    def footprint(self, model: Model, mode: str, settings: RunnerSettings) -> Footprint:
        footprint = sizing.footprint(model, settings)
        return attrs.evolve(footprint, host=footprint.host + self._cache_ram)

    def context(self, model: Model, settings: RunnerSettings) -> ContextSize:
        return sizing.context_in_force(model, settings)
