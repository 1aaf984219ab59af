"""A backend whose server mrunner builds from a pinned source (L{build.Source}): the install every such
backend shares, and what each one says of itself.

L{BuiltBackend.install} uses a configured executable, else one on PATH or an earlier build of the
variant wanted, else builds it into the shared cache; a GPU build that fails falls back to the CPU
one and is noted beside its directory (C{<dir>.failed}) so the next start does not spend a build
failing again. A backend names its source, how to ask an executable its version, and what it runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from mrunner.backends import build, childprocess, cuda, variants
from mrunner.config import Config


@attrs.frozen
class Installed:
    executable: Path
    version: str
    # The directory install() built or found under $MRUNNER_HOME or the cache; None for
    # a configured or PATH executable, which is not ours to measure or remove.
    directory: Path | None


def failure_note(directory: Path) -> Path:
    """Where a failed GPU build's reason is kept, so the next start does not spend a build failing again."""
    return directory.with_name(directory.name + ".failed")


class BuiltBackend:
    """The install of a backend built from C{source}; subclasses give L{version} and what they run."""

    name: str
    source: build.Source
    #: The module that installs it ahead of time (``python -m <installer>``), for messages.
    installer: str
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
        self._installed: Installed | None = None
        #: The build in use: C{cpu} until install() finds out otherwise.
        self.variant = "cpu"

    def build_dir(self, root: Path, variant: str = "cpu") -> Path:
        """The pinned build of C{variant}'s directory under C{root} ($MRUNNER_HOME or the shared cache)."""
        return build.directory(root, self.source, variants.directory_name(self.source.pin, variant))

    @property
    def executable(self) -> Path | None:
        """The server that install() found or built, else None."""
        return self._installed.executable if self._installed else None

    async def version(self, path: Path) -> str:
        """What the executable at C{path} is, or L{build.InstallFailed} when it does not run."""
        raise NotImplementedError

    async def found(self, version: str) -> str:
        """What install() answers once it has an executable of C{version}: the version, by default."""
        return version

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
                raise build.InstallFailed(
                    f"{self.source.target} not found at {path}: configured path does not exist"
                )
            version = await self.version(path)
            self._use(path, version, None)
            return await self.found(version)
        try:
            setting = str(self._settings.get("variant", "auto"))
            wanted = variants.choose(setting, variants.Machine(self._environ))
        except variants.UnknownVariant as e:
            raise build.InstallFailed(str(e)) from None
        if wanted == "cpu":
            return await self.found(await self._find_or_build("cpu", report))
        failed = failure_note(self.build_dir(self._cache, wanted))
        try:
            if self._fallback and failed.exists():
                again = f"python -m {self.installer} --variant={wanted}"
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
        return await self.found(version)

    async def _find_or_build(self, variant: str, report: Callable[[str], object]) -> str:
        """An earlier build of C{variant} (or for cpu one on PATH) if it runs, else a new one in the cache."""
        report(f"looking for {self.source.target}")
        for path, directory in self._candidates(variant):
            try:
                version = await self.version(path)
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
                wheels = self._cache / "backends" / self.source.name
                flags += await cuda.flags(self._reactor, nvcc, wheels, self._environ)
            except (childprocess.ChildFailed, OSError) as e:
                raise build.InstallFailed(f"cannot build the cuda variant: {e}") from None
        directory = self.build_dir(self._cache, variant)
        builder = build.Build(
            self._reactor, self.source, directory, report, environ=self._environ, flags=flags
        )
        await builder.run()
        return self._use(builder.executable, await self.version(builder.executable), directory)

    def _candidates(self, variant: str) -> Iterator[tuple[Path, Path | None]]:
        """Existing executables in order of preference: PATH (cpu only), $MRUNNER_HOME, the shared cache."""
        on_path = shutil.which(self.source.target, path=self._environ.get("PATH", os.defpath))
        if on_path and variant == "cpu":
            yield Path(on_path), None
        for directory in (self.build_dir(self._home, variant), self.build_dir(self._cache, variant)):
            executable = build.executable_in(directory, self.source)
            if executable.is_file():
                yield executable, directory

    def _use(self, executable: Path, version: str, directory: Path | None) -> str:
        self._installed = Installed(executable, version, directory)
        self.log.info("using {executable} ({version})", executable=executable, version=version)
        return version

    def running(self) -> str:
        """The installed executable, for a runner's command line; raises before install()."""
        if self._installed is None:
            raise RuntimeError(f"{self.name} is not installed: call install() first")
        return str(self._installed.executable)

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
