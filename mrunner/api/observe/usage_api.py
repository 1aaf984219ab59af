"""``GET /engines/usage[?key=&model=&from=&to=]``: usage per UTC day, key name and model.

An admin reads every key's; any other key reads its own name's only (reading is not
managing: a team member may see what it used, never what others did).

The rows come from the usage book's SQLite file (L{mrunner.teams.usage}),
read on its own thread: a report never holds up the reactor.
"""

from __future__ import annotations

import re
from typing import Any

from klein import Klein
from twisted.web.iweb import IRequest

from mrunner.api.door.callers import caller
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.reading.bodies import query
from mrunner.api.service.openapi import Piece, answer, json_content, operation, parameter
from mrunner.errors import BadRequest, Forbidden, NotFound
from mrunner.store.names import normal_name
from mrunner.teams.usage import FIELDS, Query, UsageBook

_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
ROW = {
    "type": "object",
    "required": list(FIELDS),
    "properties": {
        **{field: {"type": "string"} for field in FIELDS[:3]},
        **{field: {"type": "integer"} for field in FIELDS[3:7]},
        "seconds": {"type": "number"},
    },
}


class UsageAPI:
    """The C{/engines/usage} route."""

    app = Klein()
    handle_json_errors(app)

    def __init__(self, book: UsageBook | None):
        self._book = book

    def openapi(self) -> Piece:
        day = {"type": "string", "pattern": _DAY.pattern}
        parameters = [
            parameter("key", "query", {"type": "string"}, "only this key's name (anonymous: unnamed keys)"),
            parameter("model", "query", {"type": "string"}, "only this model"),
            parameter("from", "query", day, "from this UTC day (YYYY-MM-DD), inclusive"),
            parameter("to", "query", day, "to this UTC day (YYYY-MM-DD), inclusive"),
        ]
        body = {
            "type": "object",
            "required": ["data"],
            "properties": {"data": {"type": "array", "items": ROW}},
        }
        answers = {"200": answer("usage by day, key name and model", json_content(body))}
        return {
            "paths": {
                "/engines/usage": {
                    "get": operation(
                        "Usage per day, key and model (a normal key: its own)", answers, parameters=parameters
                    )
                }
            }
        }

    @app.route("/engines/usage", methods=["GET"])
    async def usage(self, request: IRequest) -> bytes:
        if self._book is None:
            raise NotFound("usage is not kept by this daemon", code="usage_off")
        model = query(request, "model")
        asked = Query(
            key=_key(request),
            model=normal_name(model) if model else None,
            since=_day(request, "from"),
            until=_day(request, "to"),
        )
        rows: list[dict[str, Any]] = await self._book.query(asked)
        return json_body(request, {"object": "list", "data": rows})


def _key(request: IRequest) -> str | None:
    """The key name whose usage is asked for: C{?key=}, and for a normal key always its own name."""
    asked = query(request, "key") or None
    who = caller(request)
    if who.admin or asked == who.name:
        return asked
    if asked is None:
        return who.name
    raise Forbidden(
        f"key {who.name!r} may read only its own usage: leave out ?key= (or give ?key={who.name})",
        code="usage_of_another_key",
    )


def _day(request: IRequest, key: str) -> str | None:
    value = query(request, key)
    if value is None:
        return None
    if not _DAY.fullmatch(value):
        raise BadRequest(
            f"?{key}= must be a UTC day as YYYY-MM-DD, not {value[:40]!r}", code=f"invalid_{key}"
        )
    return value
