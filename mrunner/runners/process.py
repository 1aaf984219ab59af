"""A runner's process: one inference server on a UNIX socket, a L{childprocess} child.

It holds no state of the runner's life and no timer: its machine
(L{mrunner.runners.lifecycle}) spawns it, probes its C{GET /health}, opens
it, terminates it and kills it after the grace period, and hears from it
that it wrote (it may just have become ready) and that it C{ended}. The tail
of its output goes into the error of a failed start, and all of it into a
log that rotates by size. C{setpriv
--pdeathsig KILL} makes the kernel kill it if the daemon dies, even by
SIGKILL; C{setsid} keeps it out of the terminal's process group, so a Ctrl-C
stops the daemon, which saves the runner's slots before it stops the runner
(issue 53 N2). It gets a minimal environment, not the daemon's.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.logfile import LogFile
from zope.interface import implementer

from mrunner.backends import childprocess
from mrunner.backends.loadlines import LoadReport
from mrunner.errors import RunnerFailed
from mrunner.home import PRIVATE_FILE, Home, log_time, write_private
from mrunner.interfaces import IRunnerProcess
from mrunner.values.backend import Command

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


@attrs.frozen
class RunnerOptions:
    """How runners are started and stopped, and their logs kept."""

    load_timeout: float
    stop_grace: float
    log_max_bytes: int = 10_000_000
    log_keep: int = 3


@implementer(IRunnerProcess)
class RunnerProcess:
    """One runner's child: the effects its machine asks for (spawn, probe, open, terminate, kill),
    and what it tells the machine (output came, C{ended})."""

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
        self.options = options
        self._environ = environ
        self._label = label
        self.socket = socket
        self.log_path = log_path
        self.pid: int | None = None
        self.ended: Deferred[None] = Deferred()
        #: How it ended ("exited with code 1"), once it has.
        self.how = ""
        self._child: childprocess.Child | None = None
        self._output: LogFile | None = None
        self._on_output: Callable[[], object] = lambda: None
        #: What its output said while it loaded: each device's buffers, or that one ran out.
        self.load_report = LoadReport()
        self._loading = True
        self._opened = False
        #: What a planned stop does before SIGTERM once the runner was ready (IRunnerProcess.before_stop).
        self.before_stop: Callable[[], Deferred[None]] | None = None

    def start(self, on_output: Callable[[], object]) -> None:
        """Open the log, spawn the process and write its pid file; C{on_output()} when it writes.

        @raise Exception: the process could not be spawned; no log file is left open.
        """
        self.started_at = self._reactor.seconds()
        self._on_output = on_output
        self._output = LogFile(
            self.log_path.name,
            str(self.log_path.parent),
            rotateLength=self.options.log_max_bytes,
            defaultMode=PRIVATE_FILE,
            maxRotatedFiles=self.options.log_keep,
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
                own_session=True,
            )
        except BaseException:
            self._output.close()  # the loader reports the error
            self._output = None
            raise
        self.pid = self._child.pid
        try:
            write_private(Home.pid_file(self.socket), str(self.pid))
        except OSError as e:  # only the clean-up after a crash reads it, and pdeathsig does most of that
            self.log.warn("no pid file for runner {label}: {error}", label=self._label, error=e.strerror)
        self._child.ended().addCallback(self._ended)

    def healthy(self) -> Deferred[bool]:
        """Whether it answers C{GET /health} with 200 now; never fails."""
        return self._probe(self.socket)

    def opened(self) -> None:
        """It answered: its socket made private, its output read now and then rather than as it comes."""
        self._loading = False
        self._opened = True
        with suppress(OSError):
            os.chmod(self.socket, PRIVATE_FILE)  # the runner made it with its umask
        self.log.info(
            "runner {label} ready in {seconds:.2f}s",
            label=self._label,
            seconds=self._reactor.seconds() - self.started_at,
        )
        if self._child is not None:
            self._child.read_every(OUTPUT_EVERY)

    def failure(self, why: str) -> RunnerFailed:
        """The error of a start that failed for C{why}, with the tail of its output."""
        tail = [line for line in self._child.tail() if line.strip()] if self._child else []
        text = "\n".join(tail).strip()
        return RunnerFailed(f"runner {self._label} {why}" + (f"; its last output:\n{text}" if text else ""))

    def terminate(self) -> None:
        self._loading = False
        opened, self._opened = self._opened, False
        child = self._child
        if child is None:
            return
        if opened and self.before_stop is not None:
            self.before_stop().addBoth(lambda result: child.terminate())
        else:
            child.terminate()

    def kill(self) -> None:
        if self._child is not None:
            self._child.kill_now()

    def rss(self) -> int | None:
        gone = self._child is None or self._child.exit is not None
        return None if self.pid is None or gone else rss_bytes(self.pid)

    def _lines(self, lines: list[str]) -> None:
        """The runner wrote: the log gets the lines at once, and the runner may just have become ready."""
        self._write("\n".join(lines))
        if self._loading:
            self.load_report.read(lines)
            self._on_output()

    def _write(self, text: str) -> None:
        """Each line of C{text} into the log after the time it was written: llama.cpp's own times count
        from its start, so only these place its lines among the daemon's in C{GET /logs} (issue 53 N11)."""
        if self._output is not None:
            stamp = log_time(self._reactor.seconds())
            self._output.write("".join(f"{stamp} {line}\n" for line in text.split("\n")))
            self._output.flush()  # `logs -f` follows it

    def _ended(self, exit: childprocess.Exit) -> None:
        Home.pid_file(self.socket).unlink(missing_ok=True)
        Path(self.socket).unlink(missing_ok=True)
        self.how = (
            f"exited with code {exit.code}"
            if exit.code is not None
            else f"was killed by signal {exit.signal}"
        )
        self._write(f"--- mrunner: runner ended: {self.how}")
        if self._output is not None:
            self._output.close()
            self._output = None
        self.log.info("runner {label} {how}", label=self._label, how=self.how)
        self.ended.callback(None)


def new_process(
    reactor: Any,
    probe: Probe,
    options: RunnerOptions,
    command: Command,
    socket: str,
    log_path: Path,
    label: str,
) -> RunnerProcess:
    """A L{RunnerProcess} for its machine to start: the scheduler's C{start_runner}, given the first three."""
    return RunnerProcess(reactor, probe, command, socket, log_path, label, options)


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
