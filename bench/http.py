"""The one way the bench makes HTTP clients for control calls: readiness, imports, unloads.

``httpx2`` is the HTTP client already in the venv (the ``openai`` client's own).
Clients keep connections alive and ignore proxy variables: every target is on
loopback or a UNIX socket and must be reached directly.
"""

from __future__ import annotations

import httpx2


def client(timeout: float, uds: str | None = None) -> httpx2.Client:
    """A keep-alive client, over the UNIX socket C{uds} if given; C{timeout} bounds each step."""
    transport = httpx2.HTTPTransport(uds=uds) if uds else None
    return httpx2.Client(timeout=timeout, trust_env=False, transport=transport)
