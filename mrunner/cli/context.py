"""What every command is given: the daemon, and where to write for people."""

from __future__ import annotations

import attrs
from rich.console import Console

from mrunner.cli.client import Daemon


@attrs.frozen
class Context:
    """The daemon to talk to; C{out} for results and progress, C{err} for errors."""

    daemon: Daemon
    out: Console
    err: Console
