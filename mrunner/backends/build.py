"""Build a backend's server from a pinned sdist with CMake, once per machine, atomically.

A L{Source} names the sdist (llama.cpp's is the tree vendored in the
llama-cpp-python sdist, which pins one llama.cpp commit), fetched by pip, so no
other download path is needed; builds are shared under
C{~/.cache/mrunner/backends/<name>/<pin>} (L{cache_root}, L{directory}). Every
step is a child process of the reactor. The build runs in a
temporary directory beside the destination and is renamed into place only
when complete; a lock file keeps two daemons from building at once, and a
failed or interrupted build leaves nothing behind but its error.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
from twisted.internet.defer import TimeoutError
from twisted.internet.task import deferLater
from twisted.logger import Logger

from mrunner.backends import childprocess, programs

#: Seconds between "compiling" reports, so a fast build does not flood the status.
REPORT_INTERVAL = 1.0
#: Seconds between attempts to take the lock another daemon holds.
LOCK_POLL = 2.0
#: Output lines of a failed step quoted in the error.
ERROR_TAIL = 15

_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


@attrs.frozen
class Source:
    """What to build and from where: one CMake target of a source tree inside a pinned sdist."""

    #: The backend's name, in messages and as its directory under the cache.
    name: str
    #: The sdist's package and version on the package index, fetched with ``pip download``.
    package: str
    version: str
    #: The CMake source tree inside the sdist's top directory.
    tree: str
    #: The upstream commit that sdist vendors; a build's directory is named after it.
    pin: str
    #: The CMake target, and the executable it produces.
    target: str
    cmake_flags: Sequence[str]
    #: The arguments that show a built executable runs (and exits 0) before it is put in place.
    verify: Sequence[str] = ("--version",)
    #: Edits to the extracted tree, each C{(path in the tree, text, replacement)}: the text must be
    #: there exactly once, so a pin moved past the code it changes fails the build, not the server.
    patches: Sequence[tuple[str, str, str]] = ()

    @property
    def top(self) -> str:
        """The sdist's name without ``.tar.gz``, and its top directory."""
        return f"{self.package.replace('-', '_')}-{self.version}"


def executable_in(directory: Path, source: Source) -> Path:
    """Where a build directory (ours, or cmake's) keeps C{source}'s executable."""
    return directory / "bin" / source.target


def cache_root(settings: Mapping[str, Any], environ: Mapping[str, str]) -> Path:
    """Where every daemon of this user shares builds: the ``cache`` key, else the XDG cache."""
    if settings.get("cache"):
        return Path(str(settings["cache"])).expanduser()
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME", "~"), ".cache")
    return Path(xdg).expanduser() / "mrunner"


def directory(root: Path, source: Source, leaf: str) -> Path:
    """A build of C{source} under C{root} ($MRUNNER_HOME or L{cache_root}): C{backends/<name>/<leaf>}."""
    return root / "backends" / source.name / leaf


class InstallFailed(Exception):
    """The backend cannot be installed; the message says why, for ``Error: <message>``."""


#: Seconds a server's probe (C{--version}, C{--help}) may take.
PROBE_TIMEOUT = 30.0


async def probe(reactor: Any, server: str, path: Path, flag: str) -> childprocess.Exit:
    """Run C{path} C{flag}: how it exited, else L{InstallFailed} saying that C{server} does not run."""
    running = childprocess.run(reactor, [str(path), flag])
    running.addTimeout(PROBE_TIMEOUT, reactor)
    try:
        return await running
    except (childprocess.ChildFailed, OSError) as e:
        raise InstallFailed(f"{server} at {path} does not run: {e}") from None
    except TimeoutError:
        took = f"`{flag}` took over {PROBE_TIMEOUT:.0f}s"
        raise InstallFailed(f"{server} at {path} does not run: {took}") from None


def progress(line: str) -> str | None:
    """``"compiling 123/410"`` from a ninja line, ``"compiling 45%"`` from a make line."""
    if match := _NINJA_STEP.match(line):
        return f"compiling {match[1]}/{match[2]}"
    if match := _MAKE_PERCENT.match(line):
        return f"compiling {match[1]}%"
    return None


class Throttle:
    """Passes a report on at most once per C{interval}, except a finished ``N/N`` step."""

    def __init__(self, report: Callable[[str], object], clock: Any, interval: float):
        self._report = report
        self._clock = clock
        self._interval = interval
        self._last = -interval

    def __call__(self, message: str) -> None:
        now = self._clock.seconds()
        steps = message.rpartition(" ")[2].split("/")
        finished = len(steps) == 2 and steps[0] == steps[1]
        if finished or now - self._last >= self._interval:
            self._last = now
            self._report(message)


class Build:
    """Builds C{source} so that C{dest}/bin/<target> appears complete or not at all."""

    log = Logger()

    def __init__(
        self,
        reactor: Any,
        source: Source,
        dest: Path,
        report: Callable[[str], object],
        *,
        environ: Mapping[str, str] = os.environ,
        python: str = sys.executable,
        flags: Sequence[str] = (),
    ):
        self._reactor = reactor
        self._source = source
        self._flags = tuple(flags)
        self._dest = dest
        self._report = report
        self._environ = environ
        self._python = python
        self._cores = len(os.sched_getaffinity(0))

    @property
    def executable(self) -> Path:
        return executable_in(self._dest, self._source)

    async def run(self) -> None:
        """Build, unless another daemon's build put the executable in place while we waited.

        An executable that was there before is taken as broken and replaced.
        """
        tools = self.tools()
        self._dest.parent.mkdir(parents=True, exist_ok=True)
        replacing = self.executable.exists()
        lock = await self._lock()
        try:
            if not replacing and self.executable.is_file():
                return
            await self._remove_stale()
            work = Path(tempfile.mkdtemp(prefix=f".{self._dest.name}.build-", dir=self._dest.parent))
            try:
                await self._build(work, tools)
            finally:
                await remove(self._reactor, work)
        finally:
            lock.close()

    def tools(self) -> dict[str, str]:
        """The programs the build runs, each where L{programs.find} finds it; L{InstallFailed} if one
        it needs is nowhere (ninja or make: either will do)."""
        found = {
            name: programs.find(name, self._environ, self._python)
            for name in ("cmake", "ninja", "make", "tar")
        }
        nowhere = f"not found on PATH, beside {self._python} nor as a Python package"
        for name in ("cmake", "tar"):
            if found[name] is None:
                raise InstallFailed(f"cannot build {self._source.name}: {name} {nowhere}")
        if found["ninja"] is None and found["make"] is None:
            raise InstallFailed(f"cannot build {self._source.name}: neither ninja nor make {nowhere}")
        return {name: tool for name, tool in found.items() if tool is not None}

    async def _lock(self) -> IO[bytes]:
        """An exclusive lock on C{dest}.lock; the OS drops it if this daemon dies."""
        lock = open(self._dest.with_name(self._dest.name + ".lock"), "wb")  # noqa: SIM115
        waiting = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return lock
            except BlockingIOError:
                if not waiting:
                    waiting = True
                    self._report("waiting for another daemon's build")
                await deferLater(self._reactor, LOCK_POLL, lambda: None)
            except BaseException:
                lock.close()
                raise

    async def prepare(self, work: Path, tools: Mapping[str, str]) -> Path:
        """The source fetched into C{work}, patched and configured with C{tools} (L{tools}): the
        build directory, ready to compile."""
        tree_dir, build = await self._fetch(work, tools), work / "build"
        self._report("configuring")
        await self._step(
            [
                *(tools["cmake"], "-S", str(tree_dir), "-B", str(build)),
                *("-G", "Ninja" if "ninja" in tools else "Unix Makefiles"),
                f"-DCMAKE_MAKE_PROGRAM={generator(tools)}",
                *(*self._source.cmake_flags, *self._flags),
            ],
            "configuring",
            # Keep CMake's git lookup from taking an enclosing repository's history for ours.
            env={**self._environ, "GIT_CEILING_DIRECTORIES": str(work)},
        )
        return build

    async def _build(self, work: Path, tools: Mapping[str, str]) -> None:
        source = self._source
        build = await self.prepare(work, tools)

        # The generator itself, not `cmake --build`: ninja and make pass SIGTERM on to
        # the compilers, `cmake --build` does not, so a cancelled build really stops.
        self._report("compiling")
        report = Throttle(self._report, self._reactor, REPORT_INTERVAL)

        def compiling(line: str) -> None:
            if message := progress(line):
                report(message)

        await self._step(
            [generator(tools), "-C", str(build), f"-j{self._cores}", source.target],
            "compiling",
            on_line=compiling,
        )

        self._report("verifying build")
        staged = work / "install"
        built = executable_in(staged, source)
        built.parent.mkdir(parents=True)
        os.rename(executable_in(build, source), built)
        await self._step([str(built), *source.verify], "verifying build")
        if self._dest.exists():
            # A broken earlier install: set it aside so the rename below can take its place.
            os.rename(self._dest, work / "replaced")
        os.rename(staged, self._dest)
        self.log.info(
            "built {target} {pin} into {dest}", target=source.target, pin=source.pin, dest=self._dest
        )

    async def _fetch(self, work: Path, tools: Mapping[str, str]) -> Path:
        """The sdist's source tree, downloaded and extracted under C{work}.

        pip prepares the sdist's metadata with its build backend (scikit-build-core), which
        asks pip for the ``cmake`` and ``ninja`` wheels unless it sees programs of its own:
        told ours (C{CMAKE_EXECUTABLE}, C{CMAKE_MAKE_PROGRAM}), it asks for none, so a
        machine with no package index needs only the backend's wheels beside the sdist.
        """
        source = self._source
        self._report("downloading source")
        # The sdist only: pip prepares its metadata, and with ":all:" it would build
        # each build dependency from source too (CMake itself, 30+ minutes here).
        await self._step(
            [
                *(self._python, "-m", "pip", "download", "--no-deps", "--no-binary", source.package),
                *("--no-input", "--disable-pip-version-check"),
                *(f"{source.package}=={source.version}", "-d", str(work)),
            ],
            f"downloading {source.package}",
            env={**self._environ, "CMAKE_EXECUTABLE": tools["cmake"], "CMAKE_MAKE_PROGRAM": generator(tools)},
        )
        sdists = sorted(work.glob(f"{source.top}.tar.gz"))
        if not sdists:
            raise InstallFailed(f"pip download did not produce {source.top}.tar.gz")
        self._report("extracting source")
        tree = f"{source.top}/{source.tree}"
        await self._step([tools["tar"], "-xzf", str(sdists[0]), "-C", str(work), tree], "extracting")
        patch(work / tree, source)
        return work / tree

    async def _step(self, argv: Sequence[str], what: str, **kwargs: Any) -> None:
        self.log.info("build step: {argv}", argv=" ".join(argv))
        try:
            await childprocess.run(self._reactor, argv, keep=ERROR_TAIL, **kwargs)
        except (childprocess.ChildFailed, OSError) as e:
            source = self._source
            raise InstallFailed(f"building {source.name} {source.pin} failed while {what}: {e}") from None

    async def _remove_stale(self) -> None:
        """Remove what crashed builds left; we hold the lock, so none of them is running."""
        for stale in self._dest.parent.glob(f".{self._dest.name}.*-*"):
            await remove(self._reactor, stale)


def generator(tools: Mapping[str, str]) -> str:
    """The program that runs the compiles: ninja where L{Build.tools} found it, else make."""
    return tools["ninja"] if "ninja" in tools else tools["make"]


def patch(tree: Path, source: Source) -> None:
    """Apply C{source}'s patches to its extracted C{tree}, or raise L{InstallFailed} naming the one that
    no longer fits."""
    for path, text, replacement in source.patches:
        file = tree / path
        found = file.read_text()
        if found.count(text) != 1:
            raise InstallFailed(
                f"building {source.name} {source.pin} failed while patching {path}:"
                f" the text to change is there {found.count(text)} times, not once"
            )
        file.write_text(found.replace(text, replacement))


_log = Logger()


async def remove(reactor: Any, path: Path) -> None:
    """Delete the tree at C{path} with ``rm -rf``, which may take a while, off the reactor."""
    try:
        await childprocess.run(reactor, ["rm", "-rf", "--", str(path)])
    except (childprocess.ChildFailed, OSError) as e:
        _log.warn("could not remove {path}: {error}", path=path, error=e)


async def discard(reactor: Any, dest: Path) -> None:
    """Uninstall C{dest}: gone at once by a rename (running servers keep it open), then deleted."""
    trash = dest.with_name(f".{dest.name}.trash-{os.getpid()}")
    try:
        os.rename(dest, trash)
    except FileNotFoundError:
        return
    await remove(reactor, trash)
