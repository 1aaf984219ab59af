"""The base of the tests that run the mrunner command against a daemon."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import attrs
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.utils import getProcessOutputAndValue
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.daemon import InProcessDaemon, eventually, short_home, write_config
from tests.support.ggufs import write_tiny_gguf

WAIT = 10.0  # seconds to wait for output that should come at once; only a broken command waits this long
TERMINAL = {"TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
MRUNNER = str(Path(sys.executable).with_name("mrunner"))


class Child(ProcessProtocol):
    """A running command: what it has printed so far, keys to type, and how it ended."""

    def __init__(self) -> None:
        self.output = ""
        self.code: int | None = None
        self.ended: Deferred[None] = Deferred()

    def childDataReceived(self, fd: int, data: bytes) -> None:
        self.output += data.decode(errors="replace")

    def processEnded(self, reason: Failure) -> None:
        self.code = reason.value.exitCode
        self.ended.callback(None)

    def type(self, keys: str) -> None:
        assert self.transport is not None
        self.transport.write(keys.encode())

    async def shows(self, text: str, after: int = 0) -> int:
        """Wait until C{text} appears after position C{after}; the position just past it."""
        await eventually(
            lambda: text in self.output[after:],
            WAIT,
            what=lambda: f"{text!r} to appear; the command printed:\n{self.output}",
        )
        return self.output.find(text, after) + len(text)


@attrs.frozen
class Ran:
    code: int
    out: str
    err: str


class CLITestCase(TestCase):
    timeout = 30

    def setUp(self) -> None:
        self.home = short_home(self)
        self.prepare_home()
        runner_args = ("--requests", str(self.home / "requests"), *self.runner_args())
        self.daemon = InProcessDaemon(write_config(self.home, self.config_text(), runner_args=runner_args))
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))
        self.gguf = self.home / "tiny.gguf"
        write_tiny_gguf(self.gguf, rows=4096)  # 256 KiB: several progress lines

    def prepare_home(self) -> None:
        """Set up C{self.home} before the daemon starts in it (a test's own file system, say)."""

    def runner_args(self) -> tuple[str, ...]:
        return ()

    def config_text(self) -> str:
        return ""

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "MRUNNER_HOST": self.daemon.url, **extra}

    async def mrunner(self, *args: str, stdin: bytes = b"") -> Ran:
        out, err, code = await getProcessOutputAndValue(
            MRUNNER, args, env=self.env(), reactor=reactor, stdinBytes=stdin
        )
        return Ran(code, out.decode(), err.decode())

    async def ok(self, *args: str, stdin: bytes = b"") -> str:
        """What C{mrunner ARGS} prints, after checking that it succeeded."""
        ran = await self.mrunner(*args, stdin=stdin)
        self.assertEqual(ran.code, 0, f"mrunner {' '.join(args)} failed: {ran.err}")
        return ran.out

    async def fails(self, *args: str) -> str:
        """What C{mrunner ARGS} says on stderr, after checking that it failed with status 1."""
        ran = await self.mrunner(*args)
        self.assertEqual(ran.code, 1, ran)
        return ran.err

    def spawn(self, *args: str, terminal: bool = False) -> Child:
        """Start C{mrunner ARGS}, on a pseudo-terminal if C{terminal}; the test waits for it to end."""
        child = Child()
        env = self.env(**TERMINAL) if terminal else self.env()
        reactor.spawnProcess(child, MRUNNER, [MRUNNER, *args], env=env, usePTY=terminal)  # type: ignore[attr-defined]
        return child

    def requests(self) -> list[dict[str, Any]]:
        """The bodies the runner was sent, oldest first."""
        return [json.loads(line) for line in (self.home / "requests").read_text().splitlines()]
