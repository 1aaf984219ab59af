"""What L{Routes} and the OpenAPI document ask of a route group, and the group that answers the rest.

A route group is an object with a Klein C{app} bound to it, so every module
keeps its own routes and state, and an C{openapi()} describing them, read back
from the routes' declarations (L{mrunner.api.documented}). A group may also
offer its hot routes to be rendered without Klein (L{DirectGroup}), or mount
another group under a prefix (L{MountingGroup}).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

from klein import Klein
from twisted.web.resource import IResource

from mrunner.api.errors import handle_json_errors

#: An OpenAPI fragment: C{{"paths": {...}}}.
Piece = dict[str, Any]


class RouteGroup(Protocol):
    """Routes in a Klein app, and their OpenAPI piece."""

    app: ClassVar[Klein]

    def openapi(self) -> Piece: ...


@runtime_checkable
class DirectGroup(RouteGroup, Protocol):
    """A group whose hot routes L{Routes} renders without Klein matching them."""

    def direct(self) -> Mapping[tuple[bytes, bytes], IResource]:
        """By C{(method, path without its leading slash)}, the resource (a L{Direct} in the group's
        own error shape) that renders the route."""
        ...


@runtime_checkable
class MountingGroup(RouteGroup, Protocol):
    """A group whose app mounts other groups' apps under path prefixes (C{/models})."""

    mounts: Mapping[str, RouteGroup]


class Unknown:
    """The group of last resort: a path no other group knows gets OpenAI's JSON 404 (405 for a
    method another group's route does not take is that group's)."""

    app = Klein()
    handle_json_errors(app)

    def openapi(self) -> Piece:
        return {"paths": {}}


UNKNOWN = Unknown()
