"""The daemon's HTTP root: one resource that renders each request with the route group that knows it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import RequestRedirect

from mrunner.api.door.declared import Door, Route
from mrunner.api.door.route_group import UNKNOWN, DirectGroup, MountingGroup, RouteGroup
from mrunner.api.errors import Refusal
from mrunner.errors import BadRequest


class Routes(Resource):
    """Renders a request with the first route group whose URL map matches it.

    Each group is a Klein app bound to its object (L{RouteGroup}), so every
    module keeps its own routes and state; a path no group knows is answered by
    the C{fallback} group (L{UNKNOWN}: OpenAI's JSON 404). The maps never
    change, so the choice for a method and path is remembered: matching them
    took 6% of the daemon's CPU on small chats (py-spy). A L{DirectGroup} also
    offers its hot routes by method and path, rendered (by L{Direct}, in the
    group's error shape) without Klein matching them again. Its L{Door} is what the
    groups' routes declare of themselves for the front door (L{declarations}).
    """

    isLeaf = True

    #: Paths and methods whose group is remembered; past this many the memory starts afresh.
    REMEMBERED = 1024

    def __init__(self, groups: Sequence[RouteGroup], fallback: RouteGroup = UNKNOWN):
        super().__init__()
        self.groups = tuple(groups)
        self.door = Door(declarations(groups))
        self._routes = [(group.app.url_map, group.app.resource()) for group in groups]
        self._fallback: IResource = fallback.app.resource()
        self._direct: dict[tuple[bytes, bytes], IResource] = {
            key: resource
            for group in groups
            if isinstance(group, DirectGroup)
            for key, resource in group.direct().items()
        }
        self._chosen = dict(self._direct)

    def render(self, request: IRequest) -> Any:
        if len(request.postpath) > 1 and request.postpath[-1] == b"":
            request.postpath.pop()  # a trailing slash names the same resource
        key = (request.method, b"/".join(request.postpath))
        chosen = self._chosen.get(key)
        if chosen is None:
            if len(self._chosen) >= self.REMEMBERED:
                self._chosen = dict(self._direct)
            chosen = self._chosen[key] = self._choose(key[1], key[0])
        return chosen.render(request)

    def _choose(self, postpath: bytes, method_bytes: bytes) -> IResource:
        """The group whose URL map matches, else one that knows the path for another method, else the
        fallback."""
        try:
            path = (b"/" + postpath).decode("utf-8")  # already unquoted
        except UnicodeDecodeError:  # Klein would answer in plain text, and log a traceback
            return Refusal(BadRequest("the path is not UTF-8 once percent-decoded"), shaped=self.door.shaped)
        method = method_bytes.decode("ascii", errors="replace")
        chosen = self._fallback
        for url_map, resource in self._routes:
            try:
                url_map.bind("localhost").match(path, method)
            except RequestRedirect:  # werkzeug would redirect /a//b to /a/b: no client means that
                empty = BadRequest(f"the path {path!r:.100} has an empty segment (//)")
                return Refusal(empty, shaped=self.door.shaped)
            except MethodNotAllowed:
                chosen = resource
            except NotFound:
                continue
            else:
                chosen = resource
                break
        return chosen


def declarations(groups: Iterable[object], prefix: str = "") -> list[Route]:
    """The front door's facts the C{groups} declare: their routes' (L{Documented.route}'s C{door}), then
    those a group declares for a whole API it serves (its C{door}), a mounted group's under its prefix."""
    found: list[Route] = []
    for group in groups:
        documented = getattr(group, "routes", None)
        found += [*getattr(documented, "door", ()), *getattr(group, "door", ())]
        if isinstance(group, MountingGroup):
            for mounted_prefix, mounted in group.mounts.items():
                found += declarations([mounted], mounted_prefix)
    return [attrs.evolve(route, path=(prefix + route.path).rstrip("/") or "/") for route in found]
