"""What every command is given: the daemon, and where to write for people."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from typing import Any

import attrs
from rich.console import Console

from mrunner.cli.client import Daemon
from mrunner.cli.output import show_json


@attrs.define
class Context:
    """The daemon to talk to, found when a command first asks for it (C{connect}: C{wait} asks
    again until one answers); C{out} for results and progress, C{err} for errors."""

    connect: Callable[[], Daemon]
    out: Console
    err: Console
    _daemon: Daemon | None = None

    @property
    def daemon(self) -> Daemon:
        if self._daemon is None:
            self._daemon = self.connect()
        return self._daemon

    def listing(self, path: str, args: Namespace) -> Any:
        """C{GET path}: printed as JSON and None with C{--json}, else returned for a table."""
        value = self.daemon.call("GET", path)
        if args.json:
            show_json(self.out, value)
            return None
        return value
