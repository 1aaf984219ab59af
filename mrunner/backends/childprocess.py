"""Run a child process on the reactor and read its output line by line.

Builds, ``--version`` probes and runners use it: nothing here blocks the
reactor, and a cancelled run stops its child and waits for it to be gone, so
whoever cleans up after it never races a process that is still writing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

#: How long a child may take to exit after SIGTERM before it gets SIGKILL.
KILL_GRACE = 5.0
SETPRIV = shutil.which("setpriv")
SETSID = shutil.which("setsid")
#: What a child's output pipe holds while it is read now and then (Linux's default limit for a pipe).
PIPE_BYTES = 1 << 20
READ_BYTES = 1 << 16
#: A line is cut into pieces this long: a child that never ends its line cannot make each read copy
#: all it printed so far (quadratic) or hold it all.
MAX_LINE_BYTES = 1 << 16


@attrs.frozen
class Exit:
    """How a child ended: its exit code (``None`` when a signal killed it) and last output lines."""

    argv: tuple[str, ...]
    code: int | None
    signal: int | None
    tail: tuple[str, ...]

    def describe(self) -> str:
        """``"cmake exited with code 1"`` followed by the tail of its output."""
        name = os.path.basename(self.argv[0]) if self.argv else "process"
        how = f"code {self.code}" if self.code is not None else f"signal {self.signal}"
        return "\n".join((f"{name} exited with {how}", *self.tail))


class ChildFailed(Exception):
    """A child exited with a non-zero status; the message carries its output's tail."""

    def __init__(self, exit: Exit) -> None:
        super().__init__(exit.describe())
        self.exit = exit


class _Collector(ProcessProtocol):
    """Splits stdout and stderr into lines, keeps the last ``keep``, fires observers at exit."""

    def __init__(
        self,
        argv: tuple[str, ...],
        on_line: Callable[[str], object] | None,
        on_lines: Callable[[list[str]], object] | None,
        keep: int,
    ):
        self.argv = argv
        self._on_line = on_line
        self._on_lines = on_lines
        self._partial = {1: b"", 2: b""}
        self.tail: deque[str] = deque(maxlen=keep)
        self.exit: Exit | None = None
        self.observers: list[Deferred[Exit]] = []
        self._reading: LoopingCall | None = None

    def read_every(self, clock: Any, seconds: float) -> None:
        """Read stdout and stderr every C{seconds} instead of as they come (see L{Child.read_every})."""
        readers = self._readers()
        if not readers or self.exit is not None:
            return
        for reader in readers:
            with suppress(OSError, AttributeError):  # F_SETPIPE_SZ is Linux's
                fcntl.fcntl(reader.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            reader.stopReading()
        self._reading = LoopingCall(self._read_now)
        self._reading.clock = clock
        self._reading.start(seconds, now=False)

    def read_as_it_comes(self) -> None:
        """Read the output as it comes again: the child ends, and its last words and EOF matter now."""
        if self._reading is not None:
            self._reading.stop()
            self._reading = None
            self._read_now()
            for reader in self._readers():
                reader.startReading()

    def _readers(self) -> list[Any]:
        """The readers of stdout and stderr: none for a transport without pipes, which reads as it comes."""
        pipes = getattr(self.transport, "pipes", {})
        return [pipes[fd] for fd in (1, 2) if fd in pipes]

    def _read_now(self) -> None:
        for reader in self._readers():
            for _ in range(PIPE_BYTES // READ_BYTES):
                try:
                    data = os.read(reader.fileno(), READ_BYTES)
                except BlockingIOError:
                    break
                if not data:  # EOF: Twisted's reader sees it too, and ends the pipe
                    reader.startReading()
                    break
                reader.dataReceived(data)

    def processExited(self, reason: Failure) -> None:
        self.read_as_it_comes()

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        *lines, partial = (self._partial.get(childFD, b"") + data).split(b"\n")
        if len(partial) >= MAX_LINE_BYTES:
            lines.append(partial)
            partial = b""
        self._partial[childFD] = partial
        if lines:
            self._lines(lines)

    def _lines(self, raw: list[bytes]) -> None:
        lines = [line.decode("utf-8", "replace").rstrip("\r") for line in raw]
        self.tail.extend(lines)
        if self._on_line is not None:
            for line in lines:
                self._on_line(line)
        if self._on_lines is not None:
            self._on_lines(lines)

    def processEnded(self, reason: Failure) -> None:
        for rest in self._partial.values():
            if rest:
                self._lines([rest])
        status: Any = reason.value  # ProcessDone or ProcessTerminated
        self.exit = Exit(self.argv, status.exitCode, status.signal, tuple(self.tail))
        observers, self.observers = self.observers, []
        for observer in observers:
            observer.callback(self.exit)


class Child:
    """A running child process, started by L{spawn}."""

    log = Logger()

    def __init__(self, reactor: Any, collector: _Collector, transport: Any) -> None:
        self.argv = collector.argv
        self._reactor = reactor
        self._collector = collector
        self._transport = transport
        self._killing = False

    @property
    def pid(self) -> int | None:
        return self._transport.pid

    @property
    def exit(self) -> Exit | None:
        """How the child ended, or None while it runs."""
        return self._collector.exit

    def ended(self) -> Deferred[Exit]:
        """A new Deferred firing with the L{Exit}.

        Cancelling it kills the child; call again to wait until it is really gone.
        """
        if self._collector.exit is not None:
            return succeed(self._collector.exit)
        observer: Deferred[Exit] = Deferred(self._cancel)
        self._collector.observers.append(observer)
        return observer

    def read_every(self, seconds: float) -> None:
        """Read the child's output every C{seconds}, not as it comes, until it exits or is killed.

        llama-server writes its log a line at a time, some 17 lines a request,
        and each line woke the reactor in the middle of the proxy's work. The
        pipes are enlarged so that what comes meanwhile waits there rather than
        blocking the child.
        """
        self._collector.read_every(self._reactor, seconds)

    def tail(self) -> tuple[str, ...]:
        """The last lines of its output so far."""
        return tuple(self._collector.tail)

    def _cancel(self, observer: Deferred[Exit]) -> None:
        self._collector.observers.remove(observer)
        self.kill()

    def kill(self, grace: float = KILL_GRACE) -> None:
        """SIGTERM now, SIGKILL if it is still there after C{grace} seconds; once, however often called."""
        if self.terminate():
            escalation = self._reactor.callLater(grace, self.kill_now)
            self.ended().addCallback(lambda _: escalation.active() and escalation.cancel())

    def terminate(self) -> bool:
        """SIGTERM, once however often called; whether it was sent (not to a child gone or told already).

        Its output is read as it comes from now on: its last words and EOF matter.
        """
        if self._killing or self._collector.exit is not None:
            return False
        self._killing = True
        self._collector.read_as_it_comes()
        if not self._signal("TERM"):
            return False
        self.log.info("stopping {argv[0]} (pid {pid})", argv=self.argv, pid=self.pid)
        return True

    def kill_now(self) -> None:
        """SIGKILL: it did not go when asked; nothing once it has gone."""
        self._signal("KILL")

    def _signal(self, name: str) -> bool:
        try:
            self._transport.signalProcess(name)
        except ProcessExitedAlready:
            return False
        return True


def spawn(
    reactor: Any,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], object] | None = None,
    on_lines: Callable[[list[str]], object] | None = None,
    keep: int = 40,
    die_with_parent: bool = False,
    own_session: bool = False,
) -> Child:
    """Start C{argv}; a program name without a slash is looked up on C{PATH}.

    C{env} ``None`` inherits the daemon's environment. C{on_line} sees every
    line of stdout and stderr as it arrives; C{on_lines} sees the complete
    lines of each read together, for a log that writes them at once (a runner
    writes some nine lines per request); the last C{keep} lines are kept
    for the L{Exit}. With C{die_with_parent}, C{setpriv --pdeathsig KILL}
    makes the kernel kill the child when the daemon dies, even by SIGKILL.
    With C{own_session}, C{setsid} starts it in a session of its own: a
    terminal's Ctrl-C (or a C{kill} of the daemon's process group) reaches
    the daemon only, which then stops the child in its own time (a runner
    saves its slots first). Twisted's C{spawnProcess} has no C{preexec_fn};
    each of these util-linux programs changes its own process and execs the
    next, so the pid is still the child's.
    """
    argv = tuple(argv)
    collector = _Collector(argv, on_line, on_lines, keep)
    if die_with_parent and SETPRIV is not None:
        argv = (SETPRIV, "--pdeathsig", "KILL", "--", *argv)
    if own_session and SETSID is not None:  # not a group leader, so setsid(1) execs without a fork
        argv = (SETSID, "--", *argv)
    transport = reactor.spawnProcess(collector, argv[0], argv, env=None if env is None else dict(env))
    return Child(reactor, collector, transport)


def run(reactor: Any, argv: Sequence[str], **kwargs: Any) -> Deferred[Exit]:
    """Run C{argv} to its end: the L{Exit} when it succeeds, else L{ChildFailed}.

    Cancelling the Deferred kills the child and fires only once it has exited.
    Keyword arguments are those of L{spawn}.
    """
    return Deferred.fromCoroutine(_run(reactor, argv, kwargs))


async def _run(reactor: Any, argv: Sequence[str], kwargs: dict[str, Any]) -> Exit:
    child = spawn(reactor, argv, **kwargs)
    try:
        exit = await child.ended()
    except CancelledError:
        await child.ended()
        raise
    if exit.code != 0:
        raise ChildFailed(exit)
    return exit
