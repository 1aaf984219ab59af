"""What every command is given: the daemon, and where to write for people."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import attrs
from rich.console import Console

from mrunner.cli.client import Daemon
from mrunner.cli.output import show_json


@attrs.frozen
class Context:
    """The daemon to talk to; C{out} for results and progress, C{err} for errors."""

    daemon: Daemon
    out: Console
    err: Console

    def listing(self, path: str, args: Namespace) -> Any:
        """C{GET path}: printed as JSON and None with C{--json}, else returned for a table."""
        value = self.daemon.call("GET", path)
        if args.json:
            show_json(self.out, value)
            return None
        return value
