"""A runner: one inference server process on a UNIX socket, started with spawnProcess.

It is ready when C{GET /health} says 200. Stopping it is SIGTERM, then SIGKILL
after a grace period. Its output goes to a log file and the tail of it into
the error of a failed start. C{setpriv --pdeathsig KILL} makes the kernel kill
it if the daemon dies, even by SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections import deque
from pathlib import Path
from typing import IO, Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, readBody

from mrunner.backends.base import Command
from mrunner.errors import RunnerFailed
from mrunner.proxy import runner_url

POLL_FIRST = 0.02
POLL_MAX = 0.25
TAIL_LINES = 20
SETPRIV = shutil.which("setpriv")


def with_death_signal(command: Command) -> tuple[str, list[str]]:
    """The executable and argv that make the kernel kill the runner when its parent dies."""
    argv = [command.executable, *command.args]
    if SETPRIV is None:
        return command.executable, argv
    return SETPRIV, [SETPRIV, "--pdeathsig", "KILL", "--", *argv]


class RunnerProcess(ProcessProtocol):
    """One runner process and its lifecycle: starting → ready → stopping → ended."""

    log = Logger()

    def __init__(
        self,
        reactor: Any,
        agent: Agent,
        command: Command,
        socket: str,
        log_path: Path,
        label: str,
        *,
        load_timeout: float,
        stop_grace: float,
    ):
        self._reactor = reactor
        self._agent = agent
        self._stop_grace = stop_grace
        self._label = label
        self.socket = socket
        self.ready: Deferred[None] = Deferred()
        self.ended: Deferred[None] = Deferred()
        self.started_at = reactor.seconds()
        self._tail: deque[bytes] = deque(maxlen=TAIL_LINES)
        self._partial = b""
        self._kill_call: IDelayedCall | None = None
        self._poll_call: IDelayedCall | None = None
        self._exited = False
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file: IO[bytes] = log_path.open("ab", buffering=0)  # unbuffered: `logs -f` follows it
        self.log_path = log_path
        executable, argv = with_death_signal(command)
        self.log.info("starting runner {label}: {argv}", label=label, argv=" ".join(argv))
        self._log_file.write(f"--- mrunner: {' '.join(argv)}\n".encode())
        self._process = reactor.spawnProcess(
            self, executable, argv, env=command.env if command.env is not None else os.environ
        )
        self.pid: int = self._process.pid
        self._pid_file = Path(socket).with_suffix(".pid")
        self._pid_file.write_text(str(self.pid))
        self._deadline = reactor.callLater(load_timeout, self._timed_out, load_timeout)
        self._poll(POLL_FIRST)

    def rss(self) -> int | None:
        return None if self._exited else rss_bytes(self.pid)

    def describe(self) -> dict[str, Any]:
        return {"pid": self.pid, "socket": self.socket}

    def stop(self) -> None:
        """SIGTERM now, SIGKILL after the grace period; C{ended} fires when it is gone."""
        if self._exited:
            return
        self._fail_start(RunnerFailed(f"runner {self._label} was stopped before it was ready"))
        self._signal("TERM")
        if self._kill_call is None:
            self._kill_call = self._reactor.callLater(self._stop_grace, self._signal, "KILL")

    def _signal(self, name: str) -> None:
        if not self._exited:
            self._process.signalProcess(name)

    # Readiness

    def _poll(self, delay: float) -> None:
        self._poll_call = self._reactor.callLater(delay, self._check_health, delay)

    def _look_sooner(self) -> None:
        """The runner wrote something, often that it is ready: check within POLL_FIRST, not the back-off."""
        call = self._poll_call
        if call is not None and call.active() and call.getTime() - self._reactor.seconds() > POLL_FIRST:
            call.reset(POLL_FIRST)

    def _check_health(self, delay: float) -> None:
        self._poll_call = None
        Deferred.fromCoroutine(self._health(delay))

    async def _health(self, delay: float) -> None:
        try:
            response = await self._agent.request(b"GET", runner_url(self.socket, b"/health"))
            await readBody(response)
            healthy = response.code == 200
        except Exception:
            healthy = False  # not listening yet
        if self.ready.called or self._exited:
            return
        if not healthy:
            self._poll(min(delay * 1.5, POLL_MAX))
            return
        self._deadline.cancel()
        self.log.info(
            "runner {label} ready in {seconds:.2f}s",
            label=self._label,
            seconds=self._reactor.seconds() - self.started_at,
        )
        self.ready.callback(None)

    def _timed_out(self, seconds: float) -> None:
        self._fail_start(
            RunnerFailed(f"runner {self._label} was not ready after {seconds:g}s{self._tail_text()}")
        )
        self.stop()

    def _fail_start(self, error: Exception) -> None:
        if self.ready.called:
            return
        if self._deadline.active():
            self._deadline.cancel()
        if self._poll_call is not None and self._poll_call.active():
            self._poll_call.cancel()
        self.ready.errback(error)

    def _tail_text(self) -> str:
        lines = [*self._tail, self._partial] if self._partial else list(self._tail)
        text = b"\n".join(lines).decode(errors="replace").strip()
        return f"; its last output:\n{text}" if text else ""

    # ProcessProtocol

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self._log_file.write(data)
        self._look_sooner()
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self._tail.extend(line for line in lines if line.strip())

    def processEnded(self, reason: Failure) -> None:
        self._exited = True
        self._pid_file.unlink(missing_ok=True)
        Path(self.socket).unlink(missing_ok=True)
        self._log_file.write(f"--- mrunner: runner ended: {reason.getErrorMessage()}\n".encode())
        self._log_file.close()
        if self._kill_call is not None and self._kill_call.active():
            self._kill_call.cancel()
        how = "exited" if reason.check(ProcessDone) else reason.getErrorMessage()
        self._fail_start(RunnerFailed(f"runner {self._label} {how} before it was ready{self._tail_text()}"))
        self.log.info("runner {label} ended: {how}", label=self._label, how=how)
        self.ended.callback(None)


def rss_bytes(pid: int) -> int | None:
    """Resident memory of C{pid}, read from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def clean_stale(run_dir: Path) -> None:
    """Kill runners a crashed daemon left (their pid files name them) and remove their sockets."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for pid_file in run_dir.glob("*.pid"):
        socket = pid_file.with_suffix(".sock")
        try:
            pid = int(pid_file.read_text())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(socket).encode() in f.read():
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        pid_file.unlink(missing_ok=True)
    for socket in run_dir.glob("*.sock"):
        socket.unlink(missing_ok=True)
