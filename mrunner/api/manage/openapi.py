"""``GET /openapi.json``: the OpenAPI 3.1 document, assembled from each route group's own piece.

Every route group (L{RouteGroup}: a class with a Klein ``app``) declares each
route once, with its operation (L{Documented.route}), and its ``openapi()``
piece, ``{"paths": {...}}``, is read back from those declarations; request bodies
come from the same L{validate.Shape}s that check them. A group that mounts another
under a prefix lists it in ``mounts``, and the mounted group's piece is put under
that prefix. L{routed} reads the routes back from the Klein URL maps, so a test can
hold the document and the routes to each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from klein import Klein
from twisted.web.iweb import IRequest

import mrunner
from mrunner.api.documented import IMPLICIT, Documented, template
from mrunner.api.door.route_group import MountingGroup, Piece, RouteGroup
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.openapi import COMMON_ERRORS, ERROR, ERROR_SCHEMA, answer, json_content, operation


def _pieces(group: RouteGroup, prefix: str = "") -> Iterator[tuple[str, Mapping[str, Piece]]]:
    """C{(path, operations)} of C{group}'s piece and of the pieces of its C{mounts}, under their prefixes."""
    for path, operations in group.openapi()["paths"].items():
        yield (prefix + path).rstrip("/") or "/", operations
    mounts: Mapping[str, RouteGroup] = group.mounts if isinstance(group, MountingGroup) else {}
    for mount, mounted in mounts.items():
        yield from _pieces(mounted, prefix + mount)


def _with_common_errors(op: Piece) -> Piece:
    """C{op} with L{COMMON_ERRORS}, as a copy: the declared operation is its group's, for every document."""
    responses = dict(op["responses"])
    for status, why in COMMON_ERRORS.items():
        responses.setdefault(status, answer(why, json_content(ERROR)))
    return {**op, "responses": responses}


def document(groups: Iterable[RouteGroup]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of C{groups}; every operation also lists L{COMMON_ERRORS}."""
    paths: dict[str, Any] = {}
    for group in groups:
        for path, operations in _pieces(group):
            paths.setdefault(path, {}).update(
                {method: _with_common_errors(op) for method, op in operations.items()}
            )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mrunner",
            "version": mrunner.__version__,
            "description": "A local model runner: OpenAI-compatible inference, model and runner management.",
        },
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": {"Error": ERROR_SCHEMA}},
    }


def routed(group: RouteGroup, prefix: str = "") -> set[tuple[str, str]]:
    """C{(METHOD, /openapi/{path})} for every route of C{group}'s Klein app and of its C{mounts}."""
    found: set[tuple[str, str]] = set()
    mounts: Mapping[str, RouteGroup] = group.mounts if isinstance(group, MountingGroup) else {}
    for rule in group.app.url_map.iter_rules():
        path = prefix + template(rule.rule)
        if not rule.methods:  # a branch: the group mounted there has the routes
            continue
        path = path.rstrip("/") or "/"
        found.update((method, path) for method in rule.methods - IMPLICIT)
    for mount, mounted in mounts.items():
        found |= routed(mounted, mount)
    return found


def described(doc: Mapping[str, Any]) -> set[tuple[str, str]]:
    """C{(METHOD, path)} for every operation in C{doc}."""
    return {(method.upper(), path) for path, operations in doc["paths"].items() for method in operations}


class OpenAPI:
    """Serves the document of every route group, itself included."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)

    def __init__(self, groups: Iterable[RouteGroup]):
        self.document = document([*groups, self])

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/openapi.json",
        "GET",
        operation("This document", {"200": answer("OpenAPI 3.1", json_content({"type": "object"}))}),
    )
    def serve(self, request: IRequest) -> bytes:
        return json_body(request, self.document)
