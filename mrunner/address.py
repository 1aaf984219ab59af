"""Where the daemon really listens: C{$MRUNNER_HOME/run/daemon.json}, for the CLI and C{make run}.

The address can come from C{--listen}, C{MRUNNER_LISTEN} or tap.conf, and a
port 0 is chosen by the system, so a client cannot work it out from the
defaults. Once the daemon listens it writes its URL and pid there (removed
when it stops); C{mrunner} without C{--host} or C{MRUNNER_HOST} reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IListeningPort

from mrunner.home import Home, write_private

ANY_HOST = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def url_of(description: str, address: object) -> str:
    """The URL a client uses for a server listening at C{address} (from C{description}).

    A wildcard interface is reached on loopback; a UNIX socket is C{unix:PATH}.
    """
    if isinstance(address, UNIXAddress):
        name = address.name
        return "unix:" + (name.decode() if isinstance(name, bytes) else str(name))
    if not isinstance(address, IPv4Address | IPv6Address):
        raise ValueError(f"cannot name a URL for {address!r}")
    host = ANY_HOST.get(address.host, address.host)
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if description.split(":", 1)[0] in ("ssl", "tls") else "http"
    return f"{scheme}://{host}:{address.port}"


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


class AddressFile(Service):
    """Writes the daemon's URL and pid once it listens, and removes them when it stops."""

    def __init__(self, home: Home, description: str) -> None:
        self._home = home
        self._description = description
        self.url: str | None = None

    def listening(self, port: IListeningPort) -> None:
        self.url = url_of(self._description, port.getHost())
        write_private(self._home.address, json.dumps({"url": self.url, "pid": os.getpid()}) + "\n")

    def stopService(self) -> Any:
        if (advertised(self._home) or {}).get("pid") == os.getpid():
            self._home.address.unlink(missing_ok=True)
        return super().stopService()
