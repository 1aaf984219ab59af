"""What must hold before the daemon touches anything: its home is usable and its own, its address free.

Each failure is a L{StartupError} whose message is one line naming the
option or variable, its value and what to do. It ends C{twistd} with status 1
and that line (L{one_line_errors}), instead of a traceback from a daemon that
keeps running. It is an ordinary exception on purpose: a daemonizing twistd
reports only those to the parent process waiting on the terminal.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import Service
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort

from mrunner.home import PRIVATE_FILE, Home

LOCK_FILE = "daemon.lock"
HOME_HINT = "set MRUNNER_HOME (or --home, or home in tap.conf) to a directory you can write"
LISTEN_HINT = "give --listen (or MRUNNER_LISTEN, or listen in tap.conf) an endpoint like"
LISTEN_EXAMPLES = "tcp:12434:interface=127.0.0.1 or unix:/path/api.sock"


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do, in one line."""


def check_listen(description: str) -> None:
    """Parse the endpoint C{description} without listening.

    @raise StartupError: Twisted cannot read it.
    """
    try:
        serverFromString(None, description)  # parsing only stores the reactor
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise StartupError(
            f"listen address {description!r} is not a Twisted endpoint ({e}); {LISTEN_HINT} {LISTEN_EXAMPLES}"
        ) from None


class HomeLock(Service):
    """An exclusive C{flock} on C{$MRUNNER_HOME/daemon.lock}, holding the owner's pid, for the daemon's life.

    It is taken when built, before the store sweeps staged imports or the
    scheduler cleans stale runners: a second daemon on the same home would
    otherwise kill the first's runners and race it on the model index.
    """

    def __init__(self, home: Home) -> None:
        try:
            home.prepare()
            self._fd: int | None = os.open(home.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        except OSError as e:
            raise StartupError(
                f"cannot create the home directory {home.root} ({e.strerror}); {HOME_HINT}"
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            self.release()
            raise StartupError(
                f"another mrunner daemon (pid {owner}) is using {home.root}; stop it, or give this one"
                " another MRUNNER_HOME"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def stopService(self) -> Any:
        self.release()
        return super().stopService()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = None


class Listener(StreamServerEndpointService):
    """Listens at start, and raises L{StartupError} if it cannot, rather than logging and going on.

    C{listening} is given the listening port, to say where it is (L{mrunner.daemon.listening.AddressFile}).
    """

    _raiseSynchronously = True

    def __init__(
        self,
        reactor: Any,
        description: str,
        factory: Any,
        listening: Callable[[IListeningPort], None] = lambda port: None,
    ) -> None:
        super().__init__(serverFromString(reactor, description), factory)
        self.description = description
        self._listening = listening

    def privilegedStartService(self) -> None:
        try:
            super().privilegedStartService()
        except Exception as e:
            reason = getattr(e, "socketError", None) or e
            raise StartupError(
                f"cannot listen on {self.description}: {getattr(reason, 'strerror', None) or reason};"
                f" stop what uses it, or {LISTEN_HINT} {LISTEN_EXAMPLES}"
            ) from None
        assert self._waitingForPort is not None  # set by the start just done
        self._waitingForPort.addCallback(self._said)

    def _said(self, port: IListeningPort) -> IListeningPort:
        self._listening(port)
        return port


def one_line_errors() -> None:
    """Print an uncaught L{StartupError} as C{mrunner: MESSAGE}, not as a traceback (for twistd).

    Installing it again changes nothing.
    """
    previous = sys.excepthook
    if getattr(previous, "one_line", False):
        return

    def excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if isinstance(error, StartupError):
            sys.stderr.write(f"mrunner: {error}\n")
        else:
            previous(kind, error, tb)

    excepthook.one_line = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def heed_interrupt() -> None:
    """Let SIGINT stop the daemon even when it was started with SIGINT ignored.

    A shell without job control starts a background job with SIGINT ignored
    (``make run &`` in a script, and the ``twistd ... &`` inside ``make run``
    itself); Python keeps that, and the reactor puts its handler only over
    Python's default one, so a ``kill -INT`` or a Ctrl-C did nothing to the
    daemon while its runners died (issue 53 N3). Before the reactor runs.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def daemon_process() -> None:
    """What twistd's process needs before it builds the service: L{one_line_errors}, L{heed_interrupt}."""
    one_line_errors()
    heed_interrupt()
