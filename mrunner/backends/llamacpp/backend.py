"""The llama.cpp backend as an L{IBackend}: choose, find or build the ``llama-server`` it uses, and
start one for a model (L{arguments}) with a memory estimate (L{sizing})."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from zope.interface import implementer

from mrunner.backends import build, childprocess, cuda, variants
from mrunner.backends.llamacpp import arguments, probes, sizing
from mrunner.backends.llamacpp.source import SOURCE, build_dir, failure_note
from mrunner.config import Config
from mrunner.devices import listing
from mrunner.devices.listing import Listed
from mrunner.interfaces import IBackend
from mrunner.values import ContextSize, Footprint
from mrunner.values.backend import Command, RunnerSettings
from mrunner.values.model import Model


@attrs.frozen
class _Installed:
    executable: Path
    version: str
    # The directory install() built or found under $MRUNNER_HOME or the cache; None for
    # a configured or PATH executable, which is not ours to measure or remove.
    directory: Path | None


@implementer(IBackend)
class LlamaCppBackend:
    """llama.cpp's ``llama-server``, one process per (model, mode), on a UNIX socket."""

    name = "llama.cpp"
    manages_models = False
    log = Logger()

    def __init__(
        self, config: Config, reactor: Any, environ: Mapping[str, str] = os.environ, fallback: bool = True
    ):
        self._reactor = reactor
        self._fallback = fallback
        self._environ = environ
        self._settings = config.backend(self.name)
        self._home = config.home
        self._cache = build.cache_root(self._settings, environ)
        #: The prompt cache's folder (C{--slot-save-path}), None with [cache] off; llama-server's RAM cache.
        self._slot_states = config.cache.path(config.home) if config.cache.enabled else None
        self._cache_ram = config.cache.runner_ram
        self._installed: _Installed | None = None
        self._listed: list[Listed] = []
        #: The build in use: C{cpu} until install() finds out otherwise.
        self.variant = "cpu"

    @property
    def executable(self) -> Path | None:
        """The ``llama-server`` that install() found or built, else None."""
        return self._installed.executable if self._installed else None

    def install(self, report: Callable[[str], object]) -> Deferred[str]:
        """Use a configured, PATH, earlier or shared build, else build into the shared cache."""
        return Deferred.fromCoroutine(self._install(report))

    async def _install(self, report: Callable[[str], object]) -> str:
        self.variant = "cpu"
        configured = self._settings.get("path")
        if configured:
            path = Path(str(configured)).expanduser()
            report(f"checking {path}")
            if not path.exists():
                raise build.InstallFailed(f"llama-server not found at {path}: configured path does not exist")
            version = await probes.version(self._reactor, path, self.name)
            self._use(path, version, None)
            return await self._listing(version)
        try:
            setting = str(self._settings.get("variant", "auto"))
            wanted = variants.choose(setting, variants.Machine(self._environ))
        except variants.UnknownVariant as e:
            raise build.InstallFailed(str(e)) from None
        if wanted == "cpu":
            return await self._listing(await self._find_or_build("cpu", report))
        failed = failure_note(build_dir(self._cache, wanted))
        try:
            if self._fallback and failed.exists():
                again = f"python -m mrunner.backends.llamacpp --variant={wanted}"
                raise build.InstallFailed(
                    f"{failed.read_text().strip()} (earlier: `{again}` or removing {failed} tries again)"
                )
            version = await self._find_or_build(wanted, report)
        except build.InstallFailed as e:
            if not failed.exists():
                failed.parent.mkdir(parents=True, exist_ok=True)
                failed.write_text(str(e))
            if not self._fallback:
                raise
            self.log.warn("the {variant} build failed, using the CPU build: {error}", variant=wanted, error=e)
            version = await self._find_or_build("cpu", report)
            return f"{version} (cpu: the {wanted} build failed: {e})"
        failed.unlink(missing_ok=True)
        self.variant = wanted
        return await self._listing(version)

    async def _find_or_build(self, variant: str, report: Callable[[str], object]) -> str:
        """An earlier build of C{variant} (or for cpu one on PATH) if it runs, else a new one in the cache."""
        report("looking for llama-server")
        for path, directory in self._candidates(variant):
            try:
                version = await probes.version(self._reactor, path, self.name)
            except build.InstallFailed as e:
                self.log.warn("ignoring {path}: {error}", path=path, error=e)
                continue
            return self._use(path, version, directory)
        flags: list[str] = [*variants.CMAKE_FLAGS[variant]]
        if variant == "cuda":
            nvcc = shutil.which("nvcc", path=self._environ.get("PATH", os.defpath))
            if nvcc is None:
                raise build.InstallFailed("cannot build the cuda variant: nvcc not found on PATH")
            report("finding cuBLAS")
            try:
                wheels = self._cache / "backends" / SOURCE.name
                flags += await cuda.flags(self._reactor, nvcc, wheels, self._environ)
            except (childprocess.ChildFailed, OSError) as e:
                raise build.InstallFailed(f"cannot build the cuda variant: {e}") from None
        directory = build_dir(self._cache, variant)
        builder = build.Build(self._reactor, SOURCE, directory, report, environ=self._environ, flags=flags)
        await builder.run()
        version = await probes.version(self._reactor, builder.executable, self.name)
        return self._use(builder.executable, version, directory)

    def _candidates(self, variant: str) -> Iterator[tuple[Path, Path | None]]:
        """Existing executables in order of preference: PATH (cpu only), $MRUNNER_HOME, the shared cache."""
        on_path = shutil.which("llama-server", path=self._environ.get("PATH", os.defpath))
        if on_path and variant == "cpu":
            yield Path(on_path), None
        for directory in (build_dir(self._home, variant), build_dir(self._cache, variant)):
            executable = build.executable_in(directory, SOURCE)
            if executable.is_file():
                yield executable, directory

    async def _listing(self, version: str) -> str:
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

    def _use(self, executable: Path, version: str, directory: Path | None) -> str:
        self._installed = _Installed(executable, version, directory)
        self.log.info("using {executable} ({version})", executable=executable, version=version)
        return version

    def command(self, model: Model, mode: str, socket: str, settings: RunnerSettings) -> Command:
        """The installed ``llama-server``'s command line for C{model}, as L{arguments.command} writes it."""
        if self._installed is None:
            raise RuntimeError("llama.cpp is not installed: call install() first")
        executable = str(self._installed.executable)
        states, ram = self._slot_states_folder(), self._cache_ram
        return arguments.command(executable, model, mode, socket, settings, states, ram)

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

    def disk_usage(self) -> int:
        """Bytes of the directory install() built or found; 0 for an executable we do not own."""
        if self._installed is None or self._installed.directory is None:
            return 0
        return sum(
            os.path.getsize(os.path.join(root, name))
            for root, _, names in os.walk(self._installed.directory)
            for name in names
        )

    def uninstall(self) -> Deferred[None]:
        """Remove the build install() used if it is ours; leave a configured or PATH one alone."""
        installed, self._installed = self._installed, None
        if installed is None or installed.directory is None:
            return succeed(None)
        return Deferred.fromCoroutine(build.discard(self._reactor, installed.directory))
