"""``GET /engines/requests[?model=&limit=&follow=true]``: the request records, newest first.

With ``follow=true`` the answer is a server-sent-events stream: the records
there are now, oldest first, then each new one as its answer ends, until the
client hangs up or the daemon stops.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from klein import Klein
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.openapi import Piece, answer, json_content, operation, parameter
from mrunner.api.records import Record, Records, record_key
from mrunner.api.requests import flag, query, whole
from mrunner.errors import BadRequest, NotFound

DEFAULT_LIMIT = 50


class RecordsAPI(Service):
    """The C{/engines/requests} route; as a service it ends every open follow when the daemon stops."""

    app = Klein()
    handle_json_errors(app)

    def __init__(self, records: Records | None) -> None:
        self._records = records
        self._follows: dict[Deferred[bytes], Callable[[], None]] = {}

    def openapi(self) -> Piece:
        records = {"type": "array", "items": {"type": "object"}}
        parameters = [
            parameter("model", "query", {"type": "string"}, "only this model's requests"),
            parameter("limit", "query", {"type": "integer", "minimum": 1}, "at most this many"),
            parameter("follow", "query", {"type": "boolean"}, "then each new record, as server-sent events"),
        ]
        answers = {
            "200": answer(
                "records, newest first (with follow: server-sent events)",
                {**json_content(records), "text/event-stream": {"schema": {"type": "string"}}},
            )
        }
        return {
            "paths": {
                "/engines/requests": {
                    "get": operation("The recorded requests", answers, parameters=parameters)
                }
            }
        }

    @app.route("/engines/requests", methods=["GET"])
    def requests(self, request: IRequest) -> bytes | Deferred[bytes]:
        if self._records is None:
            raise NotFound(
                "request records are off ([records] enabled = false in tap.conf)", code="records_off"
            )
        model = query(request, "model")
        model = record_key(model) if model else None
        limit = _limit(query(request, "limit"))
        recent = self._records.recent(model, limit)
        if not flag(request, "follow"):
            return json_body(request, [record.to_json() for record in recent])
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-cache")
        request.write(b"")  # headers now: the client knows it is following
        for record in reversed(recent):
            _send(request, record)
        return self._follow(request, self._records, model)

    def _follow(self, request: IRequest, records: Records, model: str | None) -> Deferred[bytes]:
        def heard(record: Record) -> None:
            if model is None or record.model == model:
                _send(request, record)

        stop = records.follow(heard)

        def hung_up(done: Deferred[bytes]) -> None:
            self._follows.pop(done)()

        done: Deferred[bytes] = Deferred(canceller=hung_up)  # Klein cancels it when the client leaves
        self._follows[done] = stop
        return done

    def stopService(self) -> None:
        super().stopService()
        follows, self._follows = self._follows, {}
        for done, stop in follows.items():
            stop()
            done.callback(b"")


def _send(request: IRequest, record: Record) -> None:
    request.write(b"data: " + json.dumps(record.to_json()).encode() + b"\n\n")


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    number = whole(value, 2**63)
    if number is None:
        raise BadRequest(f"?limit= must be a positive integer, not {value[:40]!r}", code="invalid_limit")
    return number
