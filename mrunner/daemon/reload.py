"""Re-read C{tap.conf} without a restart, on SIGHUP or C{POST /engines/_reload}.

The new file is read and checked whole before any part sees it, so an
invalid one changes nothing. Each part's L{Reconfigure} callable then
applies what it can at once; keys only a restart can apply are named in the answer and the log.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from twisted.application.service import Service
from twisted.logger import Logger

from mrunner.config import Config, ConfigError
from mrunner.errors import Unprocessable

#: A part that a reloaded configuration changes at once; the config was read and checked whole.
Reconfigure = Callable[[Config], object]

#: Keys read once at start: changing them in the file needs a restart.
RESTART_KEYS = (
    "listen",
    "home",
    "max_request_bytes",
    "backends",
    "registry",
    "huggingface",
    "sources",
    "scheduler.load_timeout",
    "scheduler.stop_grace",
    "runner.log_max_bytes",
    "runner.log_keep",
    "records",
    "log",
    "gpu",
    "http.drain_timeout",
    "cluster",
)


def _value(config: Config, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


class Reloader:
    """Reads the configuration with C{read} and hands it to each of C{parts}."""

    log = Logger()

    def __init__(self, read: Callable[[], Config], started: Config, parts: Sequence[Reconfigure]):
        self._read = read
        self._started = started  # what the restart-only keys still are, however many reloads later
        self._parts = parts

    def reload(self) -> dict[str, Any]:
        """Apply the file as it is now: C{{"status": "reloaded", "restart_required": [keys]}}.

        @raise Unprocessable: the file is invalid; the message names the key and why.
        """
        try:
            config = self._read()
        except ConfigError as e:
            self.log.error("tap.conf not reloaded, nothing changed: {error}", error=str(e))
            raise Unprocessable(
                f"tap.conf was not reloaded and nothing changed: {e}", code="invalid_config"
            ) from None
        restart = [key for key in RESTART_KEYS if _value(config, key) != _value(self._started, key)]
        for reconfigure in self._parts:
            reconfigure(config)
        if restart:
            self.log.warn("tap.conf reloaded; a restart is needed to apply {keys}", keys=", ".join(restart))
        else:
            self.log.info("tap.conf reloaded")
        return {"status": "reloaded", "restart_required": restart}


class ReloadOnHangup(Service):
    """SIGHUP reloads the configuration, as C{POST /engines/_reload} does (twistd's daemon only)."""

    log = Logger()

    def __init__(self, reactor: Any, reloader: Reloader):
        self._reactor = reactor
        self._reloader = reloader
        self._previous: Any = None

    def startService(self) -> None:
        super().startService()
        self._previous = signal.signal(signal.SIGHUP, self._hangup)

    def stopService(self) -> None:
        super().stopService()
        signal.signal(signal.SIGHUP, self._previous or signal.SIG_DFL)

    def _hangup(self, signum: int, frame: object) -> None:
        self._reactor.callFromThread(self._reload)

    def _reload(self) -> None:
        with suppress(Unprocessable):  # logged by the reloader; the daemon goes on with what it had
            self._reloader.reload()
