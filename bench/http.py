"""The one way the bench makes HTTP clients, so every target and every check is reached alike.

``httpx2`` is the HTTP client already in the venv (the ``openai`` client's own).
Clients keep connections alive and ignore proxy variables: every target is on
loopback and must be reached directly.
"""

from __future__ import annotations

import httpx2


def client(timeout: float) -> httpx2.Client:
    """A keep-alive client for one thread; C{timeout} bounds each connect, read and write."""
    return httpx2.Client(timeout=timeout, trust_env=False)
