"""What the front door knows of each route: who may call it, its body, its error shape.

The door decides before a route runs, from the request's line and headers, so
it cannot ask the route: a key's reach (L{mrunner.api.door.trust}), a body's
limit and the sink that takes it as it arrives (L{mrunner.api.door.site}), the
shape a refusal is told in (L{mrunner.api.errors.shape_for}), and what is still
answered past C{[http] max_connections} (L{mrunner.api.door.channel}) all come
from a L{Door}, whose tables are derived here from the L{Route}s the route groups
declare: each route its own, with its path (C{Documented.route}'s C{door}), and a
group those of a whole API it serves (its C{door}); L{mrunner.api.door.routing.Routes}
gathers them. A declaration names a
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
#: Where OpenAI's audio routes are served: under /v1, /engines/v1 and a backend's /engines/<backend>/v1.
AUDIO_PATHS = tuple(
    f"{prefix}/v1/audio/{task}"
    for prefix in ("", "/engines", "/engines/<backend>")
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
    #: As the router sees it; a route's declaration (L{mrunner.api.documented}) gets its route's.
    path: str = ""


def _segments(route: Route) -> list[str]:
    return route.path.strip("/").split("/")


def _path(route: Route) -> bytes:
    return route.path.rstrip("/").encode()


def open_paths(routes: Iterable[Route]) -> frozenset[bytes]:
    """The paths (without a trailing slash) any caller reaches, keys or not."""
    return frozenset(_path(route) for route in routes if route.who is Who.OPEN)


def scraped(routes: Iterable[Route]) -> bytes | None:
    """The path C{[cluster] open_metrics} opens, if a route is scraped."""
    paths = [_path(route) for route in routes if route.who is Who.SCRAPE]
    assert len(paths) <= 1, paths
    return paths[0] if paths else None


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


def admin_rules(routes: Iterable[Route]) -> AdminRules:
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


def limits(http: HTTPConfig, routes: Iterable[Route]) -> dict[bytes, int]:
    """By path, the body limit of each route that has its own."""
    return {_path(route): route.limit(http) for route in routes if route.limit is not None}


def past_cap(routes: Iterable[Route]) -> frozenset[bytes]:
    """The paths still answered when the daemon serves its limit of connections."""
    return frozenset(_path(route) for route in routes if route.past_cap)


def sinks(named: Mapping[str, T], routes: Iterable[Route]) -> dict[bytes, T]:
    """By path, what takes each route's POSTed body as it arrives, from C{named} by the name declared."""
    return {_path(route): named[route.sink] for route in routes if route.sink is not None}


def shaped(routes: Iterable[Route]) -> tuple[tuple[Reach, bytes, str], ...]:
    """(reach, path, shape) of each declaration with a shape of its own, in the order to try them."""
    return tuple((route.reach, _path(route), route.shape) for route in routes if route.shape != "openai")


class Door:
    """The front door's tables, derived once from the declarations of the routes it serves."""

    def __init__(self, routes: Iterable[Route] = ()):
        self.routes = tuple(routes)
        self.open_paths = open_paths(self.routes)
        self.metrics = scraped(self.routes)
        self.admin = admin_rules(self.routes)
        self.past_cap = past_cap(self.routes)
        self.shaped = shaped(self.routes)

    def limits(self, http: HTTPConfig) -> dict[bytes, int]:
        return limits(http, self.routes)

    def sinks(self, named: Mapping[str, T]) -> dict[bytes, T]:
        return sinks(named, self.routes)
