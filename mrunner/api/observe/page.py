"""The web page at C{/ui}, and C{GET /engines/overview}, the one JSON document it polls.

The page is three files shipped as package data (L{mrunner.ui}), read once
and served from memory. Its Content-Security-Policy lets it reach this
daemon alone: nothing it shows is fetched from anywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.resources import files
from typing import Any

from klein import Klein
from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest

from mrunner.api.documented import Documented, parameter
from mrunner.api.door.callers import caller
from mrunner.api.door.declared import Route, Who
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.manage.scheduler_json import runner_json
from mrunner.api.openapi import Piece, answer, json_content, operation
from mrunner.errors import NotFound
from mrunner.interfaces import IModelStore, IScheduler
from mrunner.teams.access import visible_name, visible_runners

TYPES = {
    "index.html": b"text/html; charset=utf-8",
    "app.js": b"text/javascript; charset=utf-8",
    "style.css": b"text/css; charset=utf-8",
}
POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
    b" img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def page_files() -> dict[str, bytes]:
    """The page's files, by name."""
    folder = files("mrunner.ui")
    return {name: folder.joinpath(name).read_bytes() for name in TYPES}


def wants_html(request: IRequest) -> bool:
    """Whether the client is a browser navigating (C{Accept: text/html}), not an API client."""
    return b"text/html" in (request.getHeader(b"accept") or b"")


#: The prompt cache's counts the page shows for each model.
CACHE_COUNTS = ("hits", "misses", "restores", "failed_restores", "saves")

OVERVIEW = {
    "type": "object",
    "required": ["now", "runners", "queue", "waiting", "memory_budget", "cache", "key", "admin"],
}


class PageAPI:
    """C{/ui}, its files, and C{/engines/overview}: runners, queue and budget in one answer."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)
    #: The page's files, which a browser fetches without a key.
    door = (Route(Who.OPEN, path="/ui/app.js"), Route(Who.OPEN, path="/ui/style.css"))

    def __init__(
        self,
        scheduler: IScheduler,
        clock: IReactorTime,
        store: IModelStore,
        cache_counts: Mapping[str, Any] | None = None,
    ) -> None:
        """C{cache_counts}: the prompt cache's counts by model (L{mrunner.cache.turns.Counts}), if on."""
        self._scheduler = scheduler
        self._clock = clock
        self._store = store
        self._cache_counts = cache_counts
        self._files = page_files()

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/ui",
        "GET",
        operation("The web page", {"200": answer("the page", {"text/html": {"schema": {"type": "string"}}})}),
        door=Route(Who.OPEN),
    )
    def page(self, request: IRequest) -> bytes:
        return self._file(request, "index.html")

    @routes.route(
        "/ui/<name>",
        "GET",
        operation(
            "A file of the page",
            {"200": answer("the file")},
            parameters=[
                parameter(
                    "name", "path", {"type": "string", "enum": sorted(TYPES)}, "one of the page's files"
                )
            ],
        ),
    )
    def file(self, request: IRequest, name: str) -> bytes:
        if name not in self._files:
            raise NotFound(f"the page has no file {name!r}")
        return self._file(request, name)

    def _file(self, request: IRequest, name: str) -> bytes:
        request.setHeader(b"content-type", TYPES[name])
        request.setHeader(b"cache-control", b"no-cache")
        request.setHeader(b"content-security-policy", POLICY)
        request.setHeader(b"x-content-type-options", b"nosniff")
        return self._files[name]

    @routes.route(
        "/engines/overview",
        "GET",
        operation(
            "Runners, queue and memory budget, as the page shows them",
            {"200": answer("the overview", json_content(OVERVIEW))},
        ),
    )
    def overview(self, request: IRequest) -> bytes:
        """What the page's runners view shows; C{now} is the daemon's clock, for keep-alive countdowns,
        and C{waiting} each model's queue.

        The runners are those of the models the key may use, and so are C{cache}'s prompt
        cache counts by model; C{key} and C{admin} say who asked, so that the page offers only
        what that key can do.
        """
        who = caller(request)
        runners = visible_runners(who.member, self._store, self._scheduler.snapshot())
        return json_body(
            request,
            {
                "now": self._clock.seconds(),
                "runners": [runner_json(runner) for runner in runners],
                "queue": self._scheduler.queued(),
                "waiting": [
                    {"model": w.model_name, "waiting": w.count, "oldest_wait": round(w.oldest_seconds, 3)}
                    for w in self._scheduler.waiting()
                    if visible_name(who.member, w.model_name)
                ],
                "memory_budget": self._scheduler.memory_budget(),
                "cache": {
                    model: {name: getattr(counts, name) for name in CACHE_COUNTS}
                    for model, counts in (self._cache_counts or {}).items()
                    if visible_name(who.member, model)
                },
                "key": who.name,
                "admin": who.admin,
            },
        )
