"""``GET /engines/usage[?key=&model=&from=&to=&limit=&after=]``: usage per UTC day, key name and model.

An admin reads every key's; any other key reads its own name's only (reading is not
managing: a team member may see what it used, never what others did).

The rows come from the usage book's SQLite file (L{mrunner.teams.usage}),
read on its own thread: a report never holds up the reactor. A page holds at
most L{MAX_LIMIT} rows, newest day first; its C{next} is the C{?after=} of the
page after it (C{DAY/KEY/MODEL} of its last row: a key's name has no slash).
"""

from __future__ import annotations

import datetime
import re

from klein import Klein
from twisted.web.iweb import IRequest

from mrunner.api.documented import Documented, parameter
from mrunner.api.door.callers import caller
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.openapi import Piece, answer, json_content, operation
from mrunner.api.reading.bodies import count, query
from mrunner.errors import BadRequest, Forbidden, NotFound
from mrunner.names import normal_name
from mrunner.teams.usage import FIELDS, Page, Query, UsageBook

_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
DEFAULT_LIMIT = 100
#: A page's most rows, as C{/engines/requests} lists at most 1000 records.
MAX_LIMIT = 1000
#: The longest C{?after=}: a day, a key's name (64) and a model name, with room to spare.
MAX_AFTER = 1024
ROW = {
    "type": "object",
    "required": list(FIELDS),
    "properties": {
        **{field: {"type": "string"} for field in FIELDS[:3]},
        **{field: {"type": "integer"} for field in FIELDS[3:7]},
        "seconds": {"type": "number"},
    },
}

DAY = {"type": "string", "pattern": _DAY.pattern}
PAGE = {
    "type": "object",
    "required": ["data", "has_more", "next"],
    "properties": {
        "data": {"type": "array", "items": ROW},
        "has_more": {"type": "boolean"},
        "next": {"type": ["string", "null"], "description": "?after= for the next page"},
    },
}


class UsageAPI:
    """The C{/engines/usage} route."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)

    def __init__(self, book: UsageBook | None):
        self._book = book

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/engines/usage",
        "GET",
        operation(
            "Usage per day, key and model (a normal key: its own)",
            {"200": answer("usage by day, key name and model", json_content(PAGE))},
            parameters=[
                parameter(
                    "key", "query", {"type": "string"}, "only this key's name (anonymous: unnamed keys)"
                ),
                parameter("model", "query", {"type": "string"}, "only this model"),
                parameter("from", "query", DAY, "from this UTC day (YYYY-MM-DD), inclusive"),
                parameter("to", "query", DAY, "to this UTC day (YYYY-MM-DD), inclusive"),
                parameter(
                    "limit",
                    "query",
                    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                    "at most this many",
                ),
                parameter(
                    "after",
                    "query",
                    {"type": "string", "maxLength": MAX_AFTER},
                    "the rows after this one (next)",
                ),
            ],
        ),
    )
    async def usage(self, request: IRequest) -> bytes:
        if self._book is None or not self._book.keeping:
            raise NotFound(
                'usage is kept only for named keys: add one ([keys."NAME"] in tap.conf)', code="usage_off"
            )
        model = query(request, "model")
        asked = Query(
            key=_key(request),
            model=normal_name(model) if model else None,
            since=_day(request, "from"),
            until=_day(request, "to"),
            after=_after(query(request, "after")),
            limit=count(request, "limit", DEFAULT_LIMIT, MAX_LIMIT),
        )
        page: Page = await self._book.query(asked)
        last = page.rows[-1] if page.more else None
        after = "/".join((last["day"], last["key"], last["model"])) if last else None
        return json_body(request, {"object": "list", "data": page.rows, "has_more": page.more, "next": after})


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
    if _DAY.fullmatch(value):
        try:
            datetime.date.fromisoformat(value)
            return value
        except ValueError:
            pass
    raise BadRequest(
        f"?{key}= must be a UTC day as YYYY-MM-DD (a day of the calendar), not {value[:40]!r}",
        code=f"invalid_{key}",
    )


def _after(value: str | None) -> tuple[str, str, str] | None:
    """C{?after=DAY/KEY/MODEL} (a page's C{next}) as the row it names."""
    if value is None:
        return None
    parts = value.split("/", 2)
    if len(value) > MAX_AFTER or len(parts) != 3 or not _DAY.fullmatch(parts[0]) or not all(parts):
        raise BadRequest(
            f"?after= must be the next of the page before (DAY/KEY/MODEL), not {value[:40]!r}",
            code="invalid_after",
        )
    return parts[0], parts[1], parts[2]
