"""C{$MRUNNER_HOME}: every path and file name under it, in one value that is passed to whoever needs one.

Only the owner may enter the home, C{run/} or C{logs/} (0700), and runner
sockets, pid files, logs and the usage file are 0600: another local user can
neither reach a runner directly, nor read a prompt in its log, nor see who used
what. A home made beforehand that others may enter is made 0700, with a line
in the log; the daemon's umask (L{mrunner.tap.makeService}) makes every other
file under it owner-only too.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import attrs
from twisted.logger import Logger, formatTime

SOCKET_SUFFIX = ".sock"
PID_SUFFIX = ".pid"
LOG_SUFFIX = ".log"
#: How a line of daemon.log and of each runner's log begins: the local time to the microsecond, so that
#: C{GET /logs} merges them in the order things happened (llama.cpp's own times count from its start).
LOG_TIME = "%Y-%m-%dT%H:%M:%S.%f%z"
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
#: The umask the daemon and its runners work under: what they create is their owner's alone.
PRIVATE_UMASK = 0o077

log = Logger()


@attrs.frozen
class Home:
    root: Path

    @property
    def run(self) -> Path:
        """Runner sockets and pid files."""
        return self.root / "run"

    @property
    def address(self) -> Path:
        """Where the daemon says the URL it listens at, and its pid (L{mrunner.address})."""
        return self.run / "daemon.json"

    @property
    def logs(self) -> Path:
        """The daemon's log and one per runner."""
        return self.root / "logs"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def backends(self) -> Path:
        return self.root / "backends"

    @property
    def load_times(self) -> Path:
        """How long each model took to load here, kept across restarts (L{mrunner.scheduling.load_times})."""
        return self.root / "load-times.json"

    def prepare(self) -> None:
        """Create the home, C{run/} and C{logs/} for the owner alone; an existing home others may enter is
        made 0700 (a line in the log says so; one this user may not change is named, and left)."""
        self.root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        mode = self.root.stat().st_mode & 0o777
        if mode & ~PRIVATE_DIR:
            try:
                self.root.chmod(PRIVATE_DIR)
            except OSError as e:
                log.warn(
                    "home {home} has mode {mode:04o}: other users may read the models, logs and usage"
                    " under it, and it cannot be made 0700 ({why}); chmod 700 it",
                    home=self.root,
                    mode=mode,
                    why=e.strerror,
                )
            else:
                log.warn(
                    "home {home} had mode {mode:04o}: made 0700, as what is under it is the owner's alone",
                    home=self.root,
                    mode=mode,
                )
        for directory in (self.run, self.logs):
            directory.mkdir(mode=PRIVATE_DIR, exist_ok=True)
            directory.chmod(PRIVATE_DIR)

    def socket(self, name: str) -> str:
        """The socket path of the runner called C{name} (the proxy finds it by that name)."""
        return os.path.join(self.run, name + SOCKET_SUFFIX)

    @staticmethod
    def pid_file(socket: str) -> Path:
        """Beside the socket: names the process that serves it, for the clean-up after a crash."""
        return Path(socket).with_suffix(PID_SUFFIX)

    def runner_log(self, model: str, mode: str) -> Path:
        """One log per model and mode, across restarts of its runner."""
        return self.logs / f"{log_name(model)}-{mode}{LOG_SUFFIX}"

    def runner_files(self) -> Iterator[tuple[Path, Path]]:
        """C{(pid file, socket)} of every runner the files in C{run/} name."""
        for pid_file in self.run.glob("*" + PID_SUFFIX):
            yield pid_file, pid_file.with_suffix(SOCKET_SUFFIX)

    def sockets(self) -> Iterator[Path]:
        return self.run.glob("*" + SOCKET_SUFFIX)


def log_name(model: str) -> str:
    """How C{model} starts the names of its runners' logs: C{ai/smollm2:latest} is C{ai_smollm2_latest}."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model)


def log_time(when: float) -> str:
    """C{when} (seconds since the epoch) as a log line begins with it (L{LOG_TIME})."""
    return formatTime(when, LOG_TIME)


def private_file(path: Path) -> None:
    """Make C{path} a file for its owner alone (0600), created empty if it is missing, whatever the umask.

    For files another library opens by name (SQLite): it then finds one with the right mode.
    """
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE))
    path.chmod(PRIVATE_FILE)


def write_private(path: Path, text: str) -> None:
    """Write C{text} to C{path}, readable by the owner alone from the moment it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def read_small(path: Path, limit: int) -> bytes:
    """C{path}'s bytes, for a file of the daemon's own that a hand may have damaged: opened without
    blocking (a FIFO put there never holds up the start), and only a regular file of at most
    C{limit} bytes is read.

    @raise OSError: it is missing, cannot be read, is no regular file, or is larger.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"it is larger than {limit} bytes")
    return data
