"""mrunner's own GETs of a runner: C{/health} while it loads, C{/metrics} when the daemon's are read.

They go through the same pool as requests (L{mrunner.proxy.pool.RunnerPool.fetch},
given as a C{Get}), on a connection of their own each that closes after the
answer, so that the kept connections stay for requests and a runner still
loading holds none.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred

#: C{get(socket, path)}: the status and body of the runner's answer to C{GET path}.
Get = Callable[[str, bytes], Deferred[tuple[int, bytes]]]


class RunnerChecks:
    """GETs runners' own routes for mrunner: C{healthy} is a runner's readiness probe, C{get} the rest."""

    def __init__(self, get: Get):
        self._get = get

    def get(self, socket: str, path: bytes) -> Deferred[tuple[int, bytes]]:
        """The runner's answer to C{GET path}: its status and whole body (cancel: abort)."""
        return self._get(socket, path)

    def healthy(self, socket: str) -> Deferred[bool]:
        """Whether the runner at C{socket} says 200 to C{GET /health}; never fails (False: not listening)."""
        return Deferred.fromCoroutine(self._healthy(socket))

    async def _healthy(self, socket: str) -> bool:
        try:
            code, _ = await self.get(socket, b"/health")
        except Exception:
            return False  # not listening yet
        return code == 200
