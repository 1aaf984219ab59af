"""A runner: one inference server process on a UNIX socket, started by L{RunnerProcess.start}.

It is ready when C{GET /health} says 200. Where it is, is its L{Readiness},
moved only as L{READINESS_MOVES} allows: C{ready} fires (or fails) on the
move out of STARTING, C{ended} on the move to ENDED. The process itself is a
L{childprocess} child: stopping it is SIGTERM, then SIGKILL after a grace
period, and the tail of its output goes into the error of a failed start.
Its output is also written to a log that rotates by size. C{setpriv
--pdeathsig KILL} makes the kernel kill it if the daemon dies, even by
SIGKILL; it gets a minimal environment, not the daemon's.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from contextlib import suppress
from enum import Enum
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.logfile import LogFile
from zope.interface import implementer

from mrunner.backends import childprocess
from mrunner.backends.base import Command
from mrunner.backends.loadlines import LoadReport
from mrunner.errors import RunnerFailed
from mrunner.home import PRIVATE_FILE, Home, write_private
from mrunner.interfaces import IRunnerProcess
from mrunner.moves import Moves

POLL_FIRST = 0.02
POLL_MAX = 0.25
TAIL_LINES = 20
#: How often a ready runner's output is read into its log (see Child.read_every).
OUTPUT_EVERY = 0.05
#: What a runner keeps of the daemon's environment: enough to find its libraries, devices and locale.
KEPT_VARIABLES = frozenset(("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "USER"))
KEPT_PREFIXES = ("LC_", "CUDA_", "HIP_", "ROCR_", "HSA_", "GPU_", "GGML_", "VK_")

#: Is the runner on this socket answering? Never fails: False while it is not listening yet.
Probe = Callable[[str], Deferred[bool]]


def runner_environment(
    extra: Mapping[str, str] | None, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The daemon's variables a runner needs (L{KEPT_VARIABLES}, L{KEPT_PREFIXES}), plus the backend's own."""
    kept = {k: v for k, v in environ.items() if k in KEPT_VARIABLES or k.startswith(KEPT_PREFIXES)}
    return {**kept, **(extra or {})}


class Readiness(Enum):
    NEW = "new"  # not started, or its spawn failed
    STARTING = "starting"  # spawned; its health is polled until the load timeout
    READY = "ready"  # it answered its health check
    FAILED = "failed"  # it will never be ready: it timed out, or was stopped first; not yet ended
    ENDED = "ended"  # its process is gone


#: Every move a runner process makes; a process that ends while starting fails its start on the way.
READINESS_MOVES = Moves(
    "runner process",
    {
        Readiness.NEW: frozenset({Readiness.STARTING}),
        Readiness.STARTING: frozenset({Readiness.READY, Readiness.FAILED}),
        Readiness.READY: frozenset({Readiness.ENDED}),
        Readiness.FAILED: frozenset({Readiness.ENDED}),
        Readiness.ENDED: frozenset(),
    },
)


@attrs.frozen
class RunnerOptions:
    """How runners are started and stopped, and their logs kept."""

    load_timeout: float
    stop_grace: float
    log_max_bytes: int = 10_000_000
    log_keep: int = 3


@implementer(IRunnerProcess)
class RunnerProcess:
    """One runner process: C{start} spawns it; C{ready} and C{ended} report what became of it."""

    log = Logger()

    def __init__(
        self,
        reactor: Any,
        probe: Probe,
        command: Command,
        socket: str,
        log_path: Path,
        label: str,
        options: RunnerOptions,
        environ: Mapping[str, str] = os.environ,
    ):
        self._reactor = reactor
        self._probe = probe
        self._command = command
        self._options = options
        self._environ = environ
        self._label = label
        self.socket = socket
        self.log_path = log_path
        self.pid: int | None = None
        self.readiness = Readiness.NEW
        self.ready: Deferred[None] = Deferred()
        self.ended: Deferred[None] = Deferred()
        self._child: childprocess.Child | None = None
        self._output: LogFile | None = None
        self._deadline: IDelayedCall | None = None
        self._poll_call: IDelayedCall | None = None
        #: What its output said while it loaded: each device's buffers, or that one ran out.
        self.load_report = LoadReport()

    def start(self) -> None:
        """Open the log, spawn the process, write its pid file, and start looking for readiness."""
        self.started_at = self._reactor.seconds()
        self._output = LogFile(
            self.log_path.name,
            str(self.log_path.parent),
            rotateLength=self._options.log_max_bytes,
            defaultMode=PRIVATE_FILE,
            maxRotatedFiles=self._options.log_keep,
        )
        argv = [self._command.executable, *self._command.args]
        self.log.info("starting runner {label}: {argv}", label=self._label, argv=" ".join(argv))
        self._write(f"--- mrunner: {' '.join(argv)}")
        try:
            self._child = childprocess.spawn(
                self._reactor,
                argv,
                env=runner_environment(self._command.env, self._environ),
                on_lines=self._lines,
                keep=TAIL_LINES,
                die_with_parent=True,
            )
        except BaseException:
            self._output.close()  # the loader reports the error; no log file is left open
            self._output = None
            raise
        self.pid = self._child.pid
        self._move(Readiness.STARTING)
        try:
            write_private(Home.pid_file(self.socket), str(self.pid))
        except OSError as e:  # only the clean-up after a crash reads it, and pdeathsig does most of that
            self.log.warn("no pid file for runner {label}: {error}", label=self._label, error=e.strerror)
        self._deadline = self._reactor.callLater(self._options.load_timeout, self._timed_out)
        self._poll(POLL_FIRST)
        self._child.ended().addCallback(self._ended)

    def rss(self) -> int | None:
        return None if self.pid is None or self.readiness is Readiness.ENDED else rss_bytes(self.pid)

    def stop(self) -> None:
        """SIGTERM now, SIGKILL after the grace period; C{ended} fires when it is gone."""
        if self._child is None or self.readiness is Readiness.ENDED:
            return
        self._fail_start(f"runner {self._label} was stopped before it was ready")
        self._child.kill(self._options.stop_grace)

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
        self._probe(self.socket).addCallback(self._checked, delay)

    def _checked(self, healthy: bool, delay: float) -> None:
        if self.readiness is not Readiness.STARTING:
            return  # an answer to a probe sent before it failed or ended
        if not healthy:
            self._poll(min(delay * 1.5, POLL_MAX))
            return
        self._cancel_timers()
        with suppress(OSError):
            os.chmod(self.socket, PRIVATE_FILE)  # the runner made it with its umask
        self.log.info(
            "runner {label} ready in {seconds:.2f}s",
            label=self._label,
            seconds=self._reactor.seconds() - self.started_at,
        )
        self._child.read_every(OUTPUT_EVERY)  # type: ignore[union-attr]  # it runs: it answered
        self._move(Readiness.READY)
        self.ready.callback(None)

    def _timed_out(self) -> None:
        self._deadline = None
        seconds = self._options.load_timeout
        self._fail_start(
            f"runner {self._label} was not ready after {seconds:g}s; raise [scheduler] load_timeout"
        )
        self.stop()

    def _fail_start(self, message: str) -> None:
        if self.readiness is not Readiness.STARTING:
            return  # ready, or its start has failed already
        self._cancel_timers()
        self._move(Readiness.FAILED)
        self.ready.errback(RunnerFailed(message + self._tail_text()))

    def _move(self, to: Readiness) -> None:
        self.readiness = READINESS_MOVES.check(self.readiness, to)

    def _cancel_timers(self) -> None:
        for call in (self._deadline, self._poll_call):
            if call is not None and call.active():
                call.cancel()
        self._deadline = self._poll_call = None

    def _tail_text(self) -> str:
        tail = [line for line in self._child.tail() if line.strip()] if self._child else []
        text = "\n".join(tail).strip()
        return f"; its last output:\n{text}" if text else ""

    # Output and end

    def _lines(self, lines: list[str]) -> None:
        """The runner wrote: the log gets the lines at once, and the runner may just have become ready."""
        self._write("\n".join(lines))
        if self.readiness is Readiness.STARTING:
            self.load_report.read(lines)
        self._look_sooner()

    def _write(self, text: str) -> None:
        if self._output is not None:
            self._output.write(text + "\n")
            self._output.flush()  # `logs -f` follows it

    def _ended(self, exit: childprocess.Exit) -> None:
        Home.pid_file(self.socket).unlink(missing_ok=True)
        Path(self.socket).unlink(missing_ok=True)
        how = (
            f"exited with code {exit.code}"
            if exit.code is not None
            else f"was killed by signal {exit.signal}"
        )
        self._write(f"--- mrunner: runner ended: {how}")
        if self._output is not None:
            self._output.close()
            self._output = None
        self._fail_start(f"runner {self._label} {how} before it was ready")
        self.log.info("runner {label} {how}", label=self._label, how=how)
        self._move(Readiness.ENDED)
        self.ended.callback(None)


def start_runner(
    reactor: Any,
    probe: Probe,
    options: RunnerOptions,
    command: Command,
    socket: str,
    log_path: Path,
    label: str,
) -> RunnerProcess:
    """A started L{RunnerProcess}: the scheduler's C{start_runner}, once the first three are given."""
    runner = RunnerProcess(reactor, probe, command, socket, log_path, label, options)
    runner.start()
    return runner


def rss_bytes(pid: int) -> int | None:
    """Resident memory of C{pid}, read from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def clean_stale(home: Home) -> None:
    """Kill runners a crashed daemon left (their pid files name them) and remove their sockets."""
    home.prepare()
    for pid_file, socket in home.runner_files():
        try:
            pid = int(pid_file.read_text())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(socket).encode() in f.read():
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        pid_file.unlink(missing_ok=True)
    for socket in home.sockets():
        socket.unlink(missing_ok=True)
