"""``GET /engines/requests[?model=&limit=&before=&follow=true]``: the request records, newest first.

A listing holds at most L{MAX_LIMIT} records; ``before`` (an id) pages back.

With ``follow=true`` the answer is a server-sent-events stream: the records
there are now, oldest first, then each new one as its answer ends, until the
client hangs up or the daemon stops, as fast as the client reads
(L{mrunner.api.observe.follow}).
"""

from __future__ import annotations

import json
from functools import partial

from klein import Klein
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from mrunner.api.documented import Documented, parameter
from mrunner.api.door.declared import Route, Who
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.observe.follow import Feed, Followers, OpenFollows
from mrunner.api.observe.records import Record, Records, record_key
from mrunner.api.openapi import Piece, answer, json_content, operation
from mrunner.api.reading.bodies import flag, query, whole
from mrunner.config import Config
from mrunner.errors import BadRequest, NotFound

DEFAULT_LIMIT = 50
# A listing's most records: a larger ?limit= is a 400 that says how to page with ?before=.
MAX_LIMIT = 1000
MAX_ID = 10**18 - 1  # ids and limits are under 10**18


class RecordsAPI(Service):
    """The C{/engines/requests} route; as a service it ends every open follow when the daemon stops."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)

    def __init__(self, records: Records | None, followers: Followers | None = None) -> None:
        self._records = records
        self._followers = Followers(Config()) if followers is None else followers
        self._follows = OpenFollows()

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/engines/requests",
        "GET",
        operation(
            "The recorded requests",
            {
                "200": answer(
                    "records, newest first (with follow: server-sent events)",
                    {
                        **json_content({"type": "array", "items": {"type": "object"}}),
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                )
            },
            parameters=[
                parameter("model", "query", {"type": "string"}, "only this model's requests"),
                parameter(
                    "limit",
                    "query",
                    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                    "at most this many",
                ),
                parameter(
                    "before", "query", {"type": "integer", "minimum": 1}, "only those older than this id"
                ),
                parameter(
                    "follow", "query", {"type": "boolean"}, "then each new record, as server-sent events"
                ),
            ],
        ),
        door=Route(Who.ADMIN),  # records hold prompts
    )
    def requests(self, request: IRequest) -> bytes | Deferred[bytes]:
        if self._records is None:
            raise NotFound(
                "request records are off ([records] enabled = false in tap.conf)", code="records_off"
            )
        model = query(request, "model")
        model = record_key(model) if model else None
        limit = _number(query(request, "limit"), "limit") or DEFAULT_LIMIT
        if limit > MAX_LIMIT:
            raise BadRequest(
                f"?limit= is at most {MAX_LIMIT}, not {limit}; page back with ?before=ID (the last id seen)",
                code="invalid_limit",
            )
        before = _number(query(request, "before"), "before")
        recent = self._records.recent(model, limit, before)
        if not flag(request, "follow"):
            return json_body(request, [record.to_json() for record in recent])
        feed = self._followers.open(request)
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-cache")
        request.write(b"")  # headers now: the client knows it is following
        for record in reversed(recent):  # held as the store's own records: bounded by ?limit
            feed.send(partial(_event, record))
        return self._follow(self._records, model, feed)

    def _follow(self, records: Records, model: str | None, feed: Feed) -> Deferred[bytes]:
        def heard(record: Record) -> None:
            if model is None or record.model == model:
                feed.send(partial(_event, record), record.size)

        unfollow = records.follow(heard)

        def stop() -> None:
            unfollow()
            feed.close()

        return self._follows.hold(stop)

    def stopService(self) -> None:
        super().stopService()
        self._follows.end()


def _event(record: Record) -> bytes:
    return b"data: " + json.dumps(record.to_json()).encode() + b"\n\n"


def _number(value: str | None, key: str) -> int | None:
    """A positive integer query value, None when absent."""
    if value is None:
        return None
    number = whole(value, MAX_ID)
    if number is None:
        raise BadRequest(f"?{key}= must be a positive integer, not {value[:40]!r}", code=f"invalid_{key}")
    return number
