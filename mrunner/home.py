"""C{$MRUNNER_HOME}: every path and file name under it, in one value that is passed to whoever needs one.

Only the owner may enter the home, C{run/} or C{logs/} (0700), and runner
sockets, pid files and logs are 0600: another local user can neither reach a
runner directly nor read a prompt in its log.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import attrs

SOCKET_SUFFIX = ".sock"
PID_SUFFIX = ".pid"
LOG_SUFFIX = ".log"
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


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

    def prepare(self) -> None:
        """Create the home, C{run/} and C{logs/} for the owner alone (an existing home is left as it is)."""
        self.root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
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


def write_private(path: Path, text: str) -> None:
    """Write C{text} to C{path}, readable by the owner alone from the moment it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as f:
        f.write(text)
