"""Where the daemon really listens: C{$MRUNNER_HOME/run/daemon.json}, as the CLI and C{make run} read it.

The address can come from C{--listen}, C{MRUNNER_LISTEN} or tap.conf, and a
port 0 is chosen by the system, so a client cannot work it out from the
defaults. Once the daemon listens it writes its URL and pid there (removed
when it stops, L{mrunner.daemon.listening}); C{mrunner} without C{--host} or
C{MRUNNER_HOST} reads it. The standard library alone: the CLI imports this,
and a command should not pay for Twisted's start-up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mrunner.home import Home


def home_of(environ: Mapping[str, str]) -> Home:
    """The home the daemon uses when nothing else names one: C{$MRUNNER_HOME}, else C{~/.mrunner}."""
    return Home(Path(environ.get("MRUNNER_HOME") or "~/.mrunner").expanduser())


def advertised(home: Home) -> dict[str, Any] | None:
    """C{{"url", "pid"}} of the daemon that listens for C{home}, or None when none has said (or the
    one that did is gone: killed, it could not remove the file)."""
    try:
        value = json.loads(home.address.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("url"), str):
        return None
    return value if isinstance(value.get("pid"), int) and running(value["pid"]) else None


def running(pid: int) -> bool:
    """Whether process C{pid} is alive (a zombie whose parent has not reaped it yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(") ")[2][:1] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
