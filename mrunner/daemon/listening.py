"""The daemon's side of C{run/daemon.json} (L{mrunner.address}): the URL it listens at, and its pid."""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.application.service import Service
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IListeningPort

from mrunner.address import advertised
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
    scheme = "https" if uses_tls(description) else "http"
    return f"{scheme}://{host}:{address.port}"


def uses_tls(description: str) -> bool:
    """Whether the listen endpoint C{description} serves TLS."""
    return description.split(":", 1)[0] in ("ssl", "tls")


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
