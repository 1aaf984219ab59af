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
from twisted.web.server import Request

from mrunner.api.aliases import Aliases, stored_name
from mrunner.api.door.callers import Caller, caller
from mrunner.api.observe.records import Record, Records, record_key
from mrunner.api.openai.wait_notes import WaitNotes, wait_note
from mrunner.api.reading.bodies import (
    check_vision,
    has_image_parts,
    json_object,
    keep_alive,
    model_name,
    prompt_texts,
    read_body,
)
from mrunner.cache.slots import conversation
from mrunner.daemon.metrics import Metrics
from mrunner.errors import MrunnerError
from mrunner.interfaces import ILease, IModelStore, IScheduler
from mrunner.names import DIGEST, SHORT_ID, normal_name
from mrunner.proxy.relay import Observer, record_writes
from mrunner.proxy.rename import Renaming, renaming
from mrunner.teams.access import check_usable
from mrunner.teams.admission import Teams, Ticket
from mrunner.teams.lengths import NONE, Length
from mrunner.values import State
from mrunner.values.request import Resolved

T = TypeVar("T")


@attrs.frozen
class Asked(Generic[T]):
    """What an inference request asks for, once L{Gateway.begin} has read, checked and resolved it."""

    #: The model's name as the store knows it (an alias's target), which the routes and the answer use.
    model: str
    #: C{keep_alive} as the request gave it (seconds; None when it gave none).
    keep_alive: float | None
    #: The body as it was received.
    body: bytes
    record: Record | None
    #: What the route's check returned of the payload (None for a body forwarded as it came).
    checked: T
    #: What the scheduler takes (L{resolved}), or why the store has no such model.
    lookup: Resolved | MrunnerError
    #: The key's admission (L{Teams.admit}); None where no teams are kept.
    ticket: Ticket | None = None
    #: Whether its answer is a stream of server-sent events, which a long wait notes (L{WaitNotes}).
    streamed: bool = False

    @property
    def resolved(self) -> Resolved:
        """The request as C{IScheduler.acquire} takes it; raises, once it is needed, why the model
        is not found (a request refused so is recorded first)."""
        return _resolved(self.lookup)

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


def _resolved(lookup: Resolved | MrunnerError) -> Resolved:
    if isinstance(lookup, MrunnerError):
        raise lookup
    return lookup


def _each(result: object, ends: list[Callable[[object], object]]) -> None:
    """The answer is over (C{result}: None, or the failure of a client gone): end each step begun."""
    for end in ends:
        end(result)


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
        #: The daemon's counts; a route adds its own (the audio routes' seconds of audio).
        self.metrics = metrics
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
        decode: Callable[[bytes], dict[str, Any]] = json_object,
        limit: int | None = None,
        recorded: Callable[[dict[str, Any]], bytes] | None = None,
        events: bool = False,
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

        A route whose body is not JSON gives its C{decode} (a form, for audio), its own C{limit}
        (the door's for its path; C{max_request_bytes} by default), and what its record keeps in
        the body's place (C{recorded}, from the payload: the fields, not the audio).

        C{events}: the API answers C{stream: true} with server-sent events (not Ollama's NDJSON).
        """
        ends: list[Callable[[object], object]] = []  # what ends with the answer, as each step begins
        request.notifyFinish().addBoth(_each, ends)
        ends.append(self._measure(request, mode))
        name = self.scheduler.backend_name(backend)
        body = read_body(request, self._max_request_bytes if limit is None else limit)
        payload = decode(body)
        model = stored_name(named(payload), self.aliases.table, self._store)
        who = caller(request)
        check_usable(who.member, self._store, model)
        seconds = keep_alive(payload.get("keep_alive"))
        checked = check(payload)
        talk = conversation(request.path, payload) or ()

        def texts() -> tuple[str, ...]:
            return prompt_texts(decode(body))

        lookup = self._lookup(name, model, mode, who.keep_alive(seconds), who.rank, talk, texts)
        if has_image_parts(payload):
            check_vision(_resolved(lookup).model)
        ticket = self._admit(request, who, model, payload, length, ends)
        record = self._record(request, model, mode, body if recorded is None else recorded(payload), ends)
        if record is not None and ticket is not None:
            record.key = ticket.key
        streamed = events and payload.get("stream") is True
        return Asked(model, seconds, body, record, checked, lookup, ticket, streamed)

    def _lookup(
        self,
        backend: str,
        name: str,
        mode: str,
        seconds: float | None,
        rank: int,
        talk: tuple[object, ...],
        texts: Callable[[], tuple[str, ...]],
    ) -> Resolved | MrunnerError:
        """The request the scheduler takes, with the store's model for C{name}; or why it has none.

        C{talk}: an OpenAI chat's or completion's conversation, by which an instance whose slot
        holds its earlier turn is preferred (L{mrunner.cache.slots.conversation}); C{texts}: what
        it gives the model to read (L{prompt_texts}), decoded again when asked.
        """
        try:
            return Resolved(backend, self._store.resolve(name), mode, seconds, rank, talk, texts)
        except MrunnerError as e:  # a missing model, an ambiguous id: refused once it is recorded
            return e

    def _admit(
        self,
        request: Request,
        who: Caller,
        model: str,
        payload: dict[str, Any],
        length: Length,
        ends: list[Callable[[object], object]],
    ) -> Ticket | None:
        """The key's limits (L{Teams.admit}), its headers, and its end when the answer ends."""
        if self._teams is None:
            return None
        ticket = self._teams.admit(who.member, normal_name(model), payload, length)
        for name, value in ticket.headers:
            request.setHeader(name, value)
        ends.append(lambda result: ticket.end(request.code))
        return ticket

    def _measure(self, request: Request, mode: str) -> Callable[[object], None]:
        """Count C{request} in C{/metrics} by C{mode} and status, and time it: what to call at its end."""
        started = self.clock.seconds()

        def finished(result: object) -> None:
            self.metrics.finished(mode, request.code, self.clock.seconds() - started)

        return finished

    def _record(
        self, request: Request, model: str, mode: str, body: bytes, ends: list[Callable[[object], object]]
    ) -> Record | None:
        """A record of this request, kept once its answer ends; None with records off."""
        if self._records is None:
            return None
        records = self._records
        record = records.start(
            record_key(model), mode, request.method, request.path, request.requestHeaders, body
        )
        ends.append(lambda result: records.end(record, request.code, result is None))
        record_writes(request, record)
        return record

    @asynccontextmanager
    async def lease(self, request: Request, asked: Asked[Any]) -> AsyncIterator[Any]:
        """A lease on a runner for what C{asked} names, for the block's duration, released however
        the block ends.

        A client that disconnects cancels the wait for the lease (leaving the
        queue) or the block's work (aborting the runner request) alike. The
        wait is measured by model, and noted in the request's record, and a
        streamed one's client is told of a long one (L{WaitNotes}). A normal
        key's C{keep_alive} is bounded here, whichever API asked (L{Caller.keep_alive}).
        """
        started = self.clock.seconds()
        self.scheduler.admit()  # a draining node says so before it says a model is missing
        resolved = asked.resolved
        waiting = self.scheduler.acquire(resolved)
        # Most leases are granted at once: only a request left waiting gets its notes' timer.
        notes = self._notes(request, resolved) if asked.streamed and not waiting.called else None
        try:
            lease = await waiting
        finally:
            if notes is not None:
                notes.stop()
        leased = self.clock.seconds()
        self.metrics.waited(lease.model, leased - started)
        if asked.record is not None:
            asked.record.queued = leased
        try:
            yield lease
        finally:
            lease.release()

    def _notes(self, request: Request, resolved: Resolved) -> WaitNotes:
        """The notes a streamed request's client gets while it waits in the queue for its runner."""

        def note() -> str | None:
            ahead = self.scheduler.ahead(resolved)
            if ahead is None:
                return None
            served = resolved.model.id
            loaded = any(r.model_id == served and r.state is State.READY for r in self.scheduler.snapshot())
            return wait_note(resolved.model.name, loaded, ahead)

        return WaitNotes(request, self.clock, note)
