"""The one scheduler path every API's inference routes take, OpenAI's, Anthropic's, Responses' and Ollama's.

Each route begins with L{Gateway.begin}, which measures, reads and checks the
request and records it in one order, and holds a lease from
C{IScheduler.acquire} while it talks to the runner, so the checks, the queue,
the memory budget, keep-alive, cancellation on disconnect, the records and the
C{/metrics} counts are the same whichever API a client speaks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.aliases import Aliases, stored_name
from mrunner.api.door.callers import caller
from mrunner.api.observe.records import Record, Records, record_key
from mrunner.api.reading.bodies import (
    check_vision,
    has_image_parts,
    json_object,
    keep_alive,
    model_name,
    read_body,
)
from mrunner.interfaces import ILease, IModelStore, IScheduler
from mrunner.metrics import Metrics
from mrunner.runners.relay import Observer, record_writes
from mrunner.runners.rename import Renaming, renaming
from mrunner.store.names import DIGEST, SHORT_ID, normal_name
from mrunner.teams.access import check_usable
from mrunner.teams.admission import Teams, Ticket
from mrunner.teams.lengths import NONE, Length

T = TypeVar("T")


@attrs.frozen
class Asked(Generic[T]):
    """What an inference request asks for, once L{Gateway.begin} has read and checked it."""

    backend: str | None
    mode: str
    model: str
    keep_alive: float | None
    #: The body as it was received.
    body: bytes
    record: Record | None
    #: What the route's check returned of the payload (None for a body forwarded as it came).
    checked: T
    #: The key's admission (L{Teams.admit}); None where no teams are kept.
    ticket: Ticket | None = None

    @property
    def named(self) -> str | None:
        """The model's name as the request gave it (normalised), which its answer says; None for a digest
        or an id, which is no name (the answer then says the runner's)."""
        if DIGEST.fullmatch(self.model) or SHORT_ID.fullmatch(self.model):
            return None
        return normal_name(self.model)

    def renaming(self, lease: ILease) -> Renaming | None:
        """What makes the answer of the runner C{lease} holds say L{named}, where the runner names it
        otherwise."""
        return renaming(lease.model, self.named)

    @property
    def meter(self) -> Observer | None:
        """What counts the key's tokens: it sees the runner's answer (L{Forwarder.forward}'s C{observer})."""
        return None if self.ticket is None else self.ticket.meter

    def runner_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body a route built for the runner, and what the key's limits impose (L{Ticket.runner_body})."""
        return body if self.ticket is None else self.ticket.runner_body(body)

    def forwarded(self) -> bytes:
        """The body to forward: as it came, unless the key's limits impose a length (decoded again then:
        the payload is not kept while a stream lasts)."""
        if self.ticket is None or self.ticket.grant.cap is None:
            return self.body
        return json.dumps(self.ticket.runner_body(json.loads(self.body))).encode()


class Gateway:
    """Begins and leases for a route; the route decides what to send the runner."""

    def __init__(
        self,
        scheduler: IScheduler,
        store: IModelStore,
        metrics: Metrics,
        clock: IReactorTime,
        max_request_bytes: int,
        records: Records | None = None,
        aliases: Aliases | None = None,
        teams: Teams | None = None,
    ):
        self.scheduler = scheduler
        self.aliases = aliases or Aliases({}, store)
        self._store = store
        self._metrics = metrics
        self.clock = clock
        self._max_request_bytes = max_request_bytes
        self._records = records
        self._teams = teams

    def begin(
        self,
        request: Request,
        mode: str,
        backend: str | None,
        check: Callable[[dict[str, Any]], T],
        *,
        named: Callable[[dict[str, Any]], str] = model_name,
        length: Length = NONE,
    ) -> Asked[T]:
        """Every step an inference request takes before it waits for a runner, in one order.

        Measure it, refuse an unknown backend, read the body within the limit,
        decode it, read its model (C{named}; the C{model} field by default; an alias
        becomes the stored model's name here, L{stored_name}), refuse a model the key
        may not use (L{check_usable}), read C{keep_alive}, run the route's C{check} on
        the payload (what it returns is kept as L{Asked.checked}), refuse images for a
        model without a projector, admit it by its key's rules (C{length}: how this
        API's request says how many tokens it may generate, L{Length}), then record it,
        with the bytes received, and the answer its client is sent, whatever writes it
        (L{record_writes}; the key's meter sees the runner's answer, L{Asked.meter}).

        The decoded payload is dropped here unless C{check} returns it: a stream
        can last minutes, and a forwarded request already holds its body as bytes.
        """
        self._measure(request, mode)
        self.scheduler.backend_name(backend)
        body = read_body(request, self._max_request_bytes)
        payload = json_object(body)
        model = stored_name(named(payload), self.aliases.table, self._store)
        check_usable(caller(request).member, self._store, model)
        seconds = keep_alive(payload.get("keep_alive"))
        checked = check(payload)
        if has_image_parts(payload):
            check_vision(self._store, model)
        ticket = self._admit(request, model, payload, length)
        record = self._record(request, model, mode, body)
        if record is not None and ticket is not None:
            record.key = ticket.key
        return Asked(backend, mode, model, seconds, body, record, checked, ticket)

    def _admit(self, request: Request, model: str, payload: dict[str, Any], length: Length) -> Ticket | None:
        """The key's limits (L{Teams.admit}), its headers, and its end when the answer ends."""
        if self._teams is None:
            return None
        ticket = self._teams.admit(caller(request).member, normal_name(model), payload, length)
        for name, value in ticket.headers:
            request.setHeader(name, value)
        request.notifyFinish().addBoth(lambda result: ticket.end(request.code))
        return ticket

    def _measure(self, request: Request, mode: str) -> None:
        """Count C{request} in C{/metrics} by C{mode} and final status, and time it."""
        started = self.clock.seconds()

        def finished(result: object) -> None:
            self._metrics.finished(mode, request.code, self.clock.seconds() - started)

        request.notifyFinish().addBoth(finished)

    def _record(self, request: Request, model: str, mode: str, body: bytes) -> Record | None:
        """A record of this request, kept once its answer ends; None with records off."""
        if self._records is None:
            return None
        records = self._records
        record = records.start(
            record_key(model), mode, request.method, request.path, request.requestHeaders, body
        )
        request.notifyFinish().addBoth(lambda result: records.end(record, request.code, result is None))
        record_writes(request, record)
        return record

    @asynccontextmanager
    async def lease(self, request: IRequest, asked: Asked[Any]) -> AsyncIterator[Any]:
        """A lease on a runner for what C{asked} names, for the block's duration, released however
        the block ends.

        A client that disconnects cancels the wait for the lease (leaving the
        queue) or the block's work (aborting the runner request) alike. The
        wait is measured by model, and noted in the request's record. A normal
        key's C{keep_alive} is bounded here, whichever API asked (L{Caller.keep_alive}).
        """
        started = self.clock.seconds()
        who = caller(request)
        seconds = who.keep_alive(asked.keep_alive)
        lease = await self.scheduler.acquire(asked.backend, asked.model, asked.mode, seconds, who.rank)
        leased = self.clock.seconds()
        self._metrics.waited(lease.model, leased - started)
        if asked.record is not None:
            asked.record.queued = leased
        try:
            yield lease
        finally:
            lease.release()
