"""The one scheduler path every API's inference routes take, OpenAI's, Anthropic's, Responses' and Ollama's.

Each route measures its request, reads the body under the same limit and
holds a lease from C{IScheduler.acquire} while it talks to the runner, so
the queue, the memory budget, keep-alive, cancellation on disconnect and the
C{/metrics} counts are the same whichever API a client speaks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.door.callers import caller
from mrunner.api.observe.records import Record, Records, record_key
from mrunner.api.reading.bodies import read_body
from mrunner.interfaces import IScheduler
from mrunner.metrics import Metrics


class Gateway:
    """Measures, reads and leases for a route; the route decides what to send the runner."""

    def __init__(
        self,
        scheduler: IScheduler,
        metrics: Metrics,
        clock: IReactorTime,
        max_request_bytes: int,
        records: Records | None = None,
    ):
        self.scheduler = scheduler
        self._metrics = metrics
        self.clock = clock
        self._max_request_bytes = max_request_bytes
        self._records = records

    def measure(self, request: Request, mode: str) -> None:
        """Count C{request} in C{/metrics} by C{mode} and final status, and time it."""
        started = self.clock.seconds()

        def finished(result: object) -> None:
            self._metrics.finished(mode, request.code, self.clock.seconds() - started)

        request.notifyFinish().addBoth(finished)

    def body(self, request: IRequest) -> bytes:
        """The request body, within C{max_request_bytes}."""
        return read_body(request, self._max_request_bytes)

    def record(self, request: Request, model: str, mode: str, body: bytes) -> Record | None:
        """A record of this request, kept once its answer ends; None with records off."""
        if self._records is None:
            return None
        records = self._records
        record = records.start(
            record_key(model), mode, request.method, request.path, request.requestHeaders, body
        )
        request.notifyFinish().addBoth(lambda result: records.end(record, request.code, result is None))
        return record

    def record_answer(self, request: Request, model: str, mode: str, body: bytes) -> Record | None:
        """L{record}, for a route that writes its own answer (a translation): what the client
        receives is what the record keeps."""
        record = self.record(request, model, mode, body)
        if record is not None:
            write = request.write

            def recorded(data: bytes) -> None:
                record.write(data)
                write(data)

            request.write = recorded  # type: ignore[method-assign]
        return record

    @asynccontextmanager
    async def lease(
        self,
        request: IRequest,
        backend: str | None,
        model: str,
        mode: str,
        keep_alive: float | None = None,
        record: Record | None = None,
    ) -> AsyncIterator[Any]:
        """A lease on a runner for the block's duration, released however the block ends.

        A client that disconnects cancels the wait for the lease (leaving the
        queue) or the block's work (aborting the runner request) alike. The
        wait is measured by model, and noted in C{record}. A normal key's C{keep_alive} is
        bounded here, whichever API asked (L{Caller.keep_alive}).
        """
        asked = self.clock.seconds()
        keep_alive = caller(request).keep_alive(keep_alive)
        lease = await self.scheduler.acquire(backend, model, mode, keep_alive)
        leased = self.clock.seconds()
        self._metrics.waited(lease.model, leased - asked)
        if record is not None:
            record.queued = leased
        try:
            yield lease
        finally:
            lease.release()
