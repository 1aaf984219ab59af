"""Twisted HTTP client connection pools whose connections are not logged (the registry's and the hub's).

Twisted's client factories log C{Starting factory} and C{Stopping factory}
for every connection: the runners' health checks and metrics scrapes alone
made about a third of the daemon's log, when they went through C{Agent}
(they go through L{mrunner.runners.checks} now, quiet likewise).
"""

from __future__ import annotations

from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory


class _QuietFactory(_HTTP11ClientFactory):
    noisy = False


class QuietPool(HTTPConnectionPool):
    """An L{HTTPConnectionPool} whose connections' factories say nothing in the log."""

    _factory = _QuietFactory
