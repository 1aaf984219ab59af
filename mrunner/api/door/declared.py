"""What the front door knows of each route, declared once: who may call it, its body, its error shape.

The door decides before a route runs, from the request's line and headers, so
it cannot ask the route: a key's reach (L{mrunner.api.door.trust}), a body's
limit and the sink that takes it as it arrives (L{mrunner.api.door.site}), the
shape a refusal is told in (L{mrunner.api.errors.shape_for}), and what is still
answered past C{[http] max_connections} (L{mrunner.api.door.channel}) all come
from L{ROUTES}, and each table they use is derived here. A declaration names a
path as the router sees it (C{<backend>} for one segment) and how far it
reaches (L{Reach}): the path alone, with or without what is below it (a mounted
API), or the path under any prefix (an API served under several). A route declared nowhere is
called with any valid key, takes C{max_request_bytes} and answers in OpenAI's
shape.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import attrs

from mrunner.config import HTTPConfig

#: The most a pull's request (C{{"from": ref}}, Ollama's C{{"model": ...}}) may carry.
MAX_CREATE_BODY = 64 * 1024
#: The largest audio file OpenAI's audio routes take (OpenAI's own limit), and their whole form's.
MAX_AUDIO_BYTES = 25 * 1024 * 1024
MAX_AUDIO_FORM = MAX_AUDIO_BYTES + 64 * 1024
#: Where OpenAI's audio routes are served: under /v1, /engines/v1 and the backend that serves them.
AUDIO_PATHS = tuple(
    f"{prefix}/v1/audio/{task}"
    for prefix in ("", "/engines", "/engines/whisper.cpp")
    for task in ("transcriptions", "translations")
)
T = TypeVar("T")


class Who(enum.Enum):
    """Who may call a route when the daemon has keys."""

    OPEN = "no key: probes, the page's files and C{/}, which a browser's navigation reaches without one"
    KEY = "any key"
    MANAGE = "any key reads it (GET, HEAD); only an admin key changes anything"
    ADMIN = "an admin key only: it manages models, controls runners, or shows prompts"
    SCRAPE = (
        "no key with [cluster] open_metrics, which then shows the load signals alone; else any key,"
        " a normal key seeing the load signals and its own series"
    )


class Reach(enum.Enum):
    """Which request paths a declaration covers."""

    EXACT = "the path alone (a trailing slash names the same)"
    UNDER = "the path and every path below it"
    BELOW = "every path below it, not the path itself"
    ENDING = "the path under any prefix"


@attrs.frozen
class Route:
    """One route's, or one API's, facts for the front door."""

    path: str
    who: Who = Who.KEY
    reach: Reach = Reach.EXACT
    #: The most bytes its body may carry, from C{[http]}; None: C{max_request_bytes}.
    limit: Callable[[HTTPConfig], int] | None = None
    #: The name of what takes its POSTed body as it arrives (see L{sinks}).
    sink: str | None = None
    #: Its error shape's name in L{mrunner.api.errors.SHAPES}.
    shape: str = "openai"
    #: Answered past C{[http] max_connections}, and the connection closed after.
    past_cap: bool = False


ROUTES: tuple[Route, ...] = (
    # The daemon's own.
    Route("/", Who.OPEN),
    Route("/health", Who.OPEN, past_cap=True),
    Route("/ready", Who.OPEN),
    Route("/metrics", Who.SCRAPE),
    Route("/ui", Who.OPEN),
    Route("/ui/app.js", Who.OPEN),
    Route("/ui/style.css", Who.OPEN),
    Route("/models", Who.MANAGE, Reach.UNDER),
    Route("/models/load", Who.MANAGE, limit=lambda http: http.max_load_bytes, sink="upload"),
    Route("/models/create", Who.MANAGE, limit=lambda http: MAX_CREATE_BODY),
    Route("/logs", Who.ADMIN, Reach.UNDER),
    Route("/engines/unload", Who.ADMIN),
    Route("/engines/_configure", Who.ADMIN),
    Route("/engines/<backend>/_configure", Who.ADMIN),
    Route("/engines/_reload", Who.ADMIN),
    Route("/engines/_drain", Who.ADMIN),
    Route("/engines/requests", Who.ADMIN),  # records hold prompts
    Route("/engines/cache", Who.ADMIN),  # the prompt cache's states: whose prompts, when
    # OpenAI's audio routes take a form with a file, larger than a JSON body.
    *(Route(path, limit=lambda http: MAX_AUDIO_FORM) for path in AUDIO_PATHS),
    # Anthropic's Messages, under /anthropic and wherever its two routes are served.
    Route("/anthropic", reach=Reach.BELOW, shape="anthropic"),
    Route("/v1/messages", reach=Reach.ENDING, shape="anthropic"),
    Route("/v1/messages/count_tokens", reach=Reach.ENDING, shape="anthropic"),
    # Ollama's API, its model management for admins.
    Route("/api", reach=Reach.BELOW, shape="ollama"),
    *(
        Route(f"/api/{name}", Who.ADMIN, shape="ollama")
        for name in ("pull", "push", "delete", "copy", "create")
    ),
)


def _segments(route: Route) -> list[str]:
    return route.path.strip("/").split("/")


def _path(route: Route) -> bytes:
    return route.path.rstrip("/").encode()


def open_paths(routes: Iterable[Route] = ROUTES) -> frozenset[bytes]:
    """The paths (without a trailing slash) any caller reaches, keys or not."""
    return frozenset(_path(route) for route in routes if route.who is Who.OPEN)


def scraped(routes: Iterable[Route] = ROUTES) -> bytes:
    """The path C{[cluster] open_metrics} opens."""
    (path,) = (_path(route) for route in routes if route.who is Who.SCRAPE)
    return path


@attrs.frozen
class AdminRules:
    """Where only admin keys reach, in the three forms the door checks.

    C{areas}: a first segment whose paths, all of them, are L{Who.ADMIN} or
    L{Who.MANAGE}; C{engines}: names that, as C{/engines/NAME} or
    C{/engines/BACKEND/NAME}, are admin with all below them; C{ollama}: the
    C{/api/NAME} that manage Ollama's models.
    """

    areas: Mapping[bytes, Who]
    engines: frozenset[bytes]
    ollama: frozenset[bytes]


def admin_rules(routes: Iterable[Route] = ROUTES) -> AdminRules:
    areas: dict[bytes, Who] = {}
    engines: set[bytes] = set()
    ollama: set[bytes] = set()
    for route in routes:
        if route.who not in (Who.ADMIN, Who.MANAGE):
            continue
        first, *rest = (segment.encode() for segment in _segments(route))
        if first == b"engines":
            engines.add(rest[-1])
        elif first == b"api":
            ollama.add(rest[0])
        elif route.reach is Reach.UNDER and not rest:
            areas[first] = route.who
    return AdminRules(areas, frozenset(engines), frozenset(ollama))


def limits(http: HTTPConfig, routes: Iterable[Route] = ROUTES) -> dict[bytes, int]:
    """By path, the body limit of each route that has its own."""
    return {_path(route): route.limit(http) for route in routes if route.limit is not None}


def past_cap(routes: Iterable[Route] = ROUTES) -> frozenset[bytes]:
    """The paths still answered when the daemon serves its limit of connections."""
    return frozenset(_path(route) for route in routes if route.past_cap)


def sinks(named: Mapping[str, T], routes: Iterable[Route] = ROUTES) -> dict[bytes, T]:
    """By path, what takes each route's POSTed body as it arrives, from C{named} by the name declared."""
    return {_path(route): named[route.sink] for route in routes if route.sink is not None}


def shaped(routes: Iterable[Route] = ROUTES) -> tuple[tuple[Reach, bytes, str], ...]:
    """(reach, path, shape) of each declaration with a shape of its own, in the order to try them."""
    return tuple((route.reach, _path(route), route.shape) for route in routes if route.shape != "openai")
