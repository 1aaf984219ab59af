"""A fake llama.cpp install: its executable, its version output, a reactor that records its processes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends.llamacpp import source
from mrunner.backends.llamacpp.backend import LlamaCppBackend
from mrunner.config import CacheConfig, Config

VERSION_OUTPUT = b"version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0\n"


@attrs.define(eq=False)
class FakeChild:
    """A spawned child: the test reads its command, writes its output and ends it."""

    protocol: ProcessProtocol
    argv: tuple[str, ...]
    env: dict[str, str] | None
    pid: int = 42
    signals: list[str] = attrs.field(factory=list)
    ended: bool = False

    @property
    def program(self) -> str:
        return os.path.basename(self.argv[0])

    def signalProcess(self, name: str) -> None:
        if self.ended:
            raise ProcessExitedAlready()
        self.signals.append(name)

    def finish(self, code: int = 0, stderr: bytes = b"", stdout: bytes = b"") -> None:
        if stdout:
            self.protocol.childDataReceived(1, stdout)
        if stderr:
            self.protocol.childDataReceived(2, stderr)
        self.ended = True
        reason = ProcessDone(0) if code == 0 else ProcessTerminated(exitCode=code)
        self.protocol.processEnded(Failure(reason))


class FakeProcessReactor(MemoryReactorClock):
    """Records spawnProcess calls; nothing runs until the test finishes a child."""

    def __init__(self) -> None:
        super().__init__()
        self.children: list[FakeChild] = []

    def spawnProcess(self, protocol: ProcessProtocol, executable: str, args: Any, env: Any) -> FakeChild:
        child = FakeChild(protocol, tuple(args), env)
        self.children.append(child)
        protocol.makeConnection(child)
        return child

    def next(self, program: str) -> FakeChild:
        """The oldest unfinished child, which must be C{program}."""
        pending = [child for child in self.children if not child.ended]
        assert pending, f"expected {program} to be running, nothing is"
        assert pending[0].program == program, f"expected {program}, got {pending[0].argv}"
        return pending[0]


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


class Fixture:
    """A home, a shared cache, a PATH of fake tools, and a backend over the fake reactor."""

    def __init__(self, case: SynchronousTestCase, cache: CacheConfig | None = None, **settings: Any) -> None:
        root = Path(case.mktemp())
        self.home, self.cache, self.bin = root / "home", root / "cache", root / "bin"
        for tool in ("cmake", "ninja", "tar"):
            executable(self.bin / tool)
        self.environ = {"PATH": str(self.bin), "HOME": str(root)}
        self.reactor = FakeProcessReactor()
        self.reports: list[str] = []
        backends = {"llama.cpp": {"cache": str(self.cache), **settings}}
        config = Config(home=self.home, backends=backends, cache=cache or CacheConfig())
        self.backend = LlamaCppBackend(config, self.reactor, self.environ)

    def pinned(self, root: Path) -> Path:
        return root / "backends" / "llama.cpp" / source.PIN

    def install(self) -> Deferred[str]:
        return self.backend.install(self.reports.append)
