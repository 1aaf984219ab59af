"""``make run`` as users start it: in a terminal (a pty whose foreground process group it is), where
Ctrl-C is a key typed, or as the background job of a script, in a process group of its own."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.protocol import ProcessProtocol
from twisted.trial.unittest import SynchronousTestCase

from tests.support.daemon import alive, eventually

ROOT = Path(__file__).resolve().parents[2]
#: This venv (not resolved: its python is a link to the interpreter it was made from).
VENV = Path(sys.executable).parent.parent
#: ``make run`` in the checkout on this venv; the backends are built (``-o backend``: not again).
MAKE_RUN = ["make", "--no-print-directory", "-C", str(ROOT), "-o", "backend", f"VENV={VENV}", "run"]
#: A script's ``make run &`` (no job control: the job starts with SIGINT ignored), then its wait; the
#: script ignores SIGINT itself, so that it waits on for make after the process group's SIGINT.
IN_THE_BACKGROUND = ["sh", "-c", 'trap "" INT; "$@" & wait $!', "sh"]


class MakeRun(ProcessProtocol):
    """A ``make run``: its daemon's address, what it printed (the daemon's log among it), when it ended."""

    def __init__(self, home: Path, port: int) -> None:
        self.home = home
        self.url = f"http://127.0.0.1:{port}"
        self.output = b""
        self.ended: Deferred[None] = Deferred()
        self.transport: Any = None

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.output += data

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def tail(self) -> str:
        return self.text()[-4000:]

    async def printed(self, text: str, seconds: float) -> None:
        """Wait until it has printed C{text}; fail with its output if it ends or the time runs out first."""
        await eventually(lambda: text in self.text() or self.ended.called, seconds, what=self.tail)
        if text not in self.text():
            raise AssertionError(f"make run ended without printing {text!r}:\n{self.tail()}")

    def daemon_pid(self) -> int | None:
        """The daemon's pid, from its home's lock; None when there is none."""
        try:
            return int((self.home / "daemon.lock").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    async def ctrl_c(self, seconds: float = 120) -> None:
        """Type Ctrl-C at its terminal, and wait for it to end."""
        self.transport.write(b"\x03")
        await eventually(lambda: self.ended.called, seconds, what=self.tail)

    async def interrupt_group(self, seconds: float = 120) -> None:
        """``kill -INT`` of its process group (the script's), and wait for it to end."""
        os.killpg(self.transport.pid, signal.SIGINT)
        await eventually(lambda: self.ended.called, seconds, what=self.tail)

    async def stop(self) -> None:
        """What a test leaves running: SIGTERM to the daemon, then make and its script."""
        pid = self.daemon_pid()
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGTERM)
            await eventually(lambda: not alive(pid), 30, what=lambda: f"daemon {pid} to stop")
        if not self.ended.called:
            self.transport.signalProcess("KILL")
            await self.ended


async def make_run(test: SynchronousTestCase, home: Path, port: int, terminal: bool = True) -> MakeRun:
    """``make run`` on C{home} at 127.0.0.1:C{port}, in a terminal or in the background; returned once it
    says it serves SmolLM2, stopped after C{test}."""
    run = MakeRun(home, port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MRUNNER_")}
    env.update(MRUNNER_HOME=str(home), MRUNNER_LISTEN=f"tcp:{port}:interface=127.0.0.1")
    if terminal:  # usePTY: the child leads a session whose controlling terminal is the pty
        argv, pty = MAKE_RUN, True
    else:  # setsid: a session and process group of its own, not the test's
        argv, pty = [str(shutil.which("setsid")), *IN_THE_BACKGROUND, *MAKE_RUN], False
    executable = str(shutil.which(argv[0]))
    run.transport = reactor.spawnProcess(run, executable, argv, env=env, path=str(ROOT), usePTY=pty)
    test.addCleanup(lambda: ensureDeferred(run.stop()))
    await run.printed("mrunner serves ai/smollm2 on", 180)
    return run
