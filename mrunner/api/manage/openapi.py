"""``GET /openapi.json``: the OpenAPI 3.1 document, assembled from each route group's own piece.

Every route group (L{RouteGroup}: a class with a Klein ``app``) describes its
routes in an ``openapi()`` method returning ``{"paths": {...}}``, written beside
the routes so the two change together; request bodies come from the same
L{validate.Shape}s that check them. A group that mounts another under a prefix lists
it in ``mounts``. L{routed} reads the routes back from the Klein URL maps, so a test
can hold the document and the routes to each other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from klein import Klein
from twisted.web.iweb import IRequest

import mrunner
from mrunner.api.door.route_group import MountingGroup, Piece, RouteGroup
from mrunner.api.errors import handle_json_errors, json_body

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": ["string", "null"]},
                # A runner's own errors, passed through, carry their HTTP status as the code.
                "code": {"type": ["string", "integer", "null"]},
                "param": {"type": ["string", "null"]},
            },
        }
    },
}
ERROR = {"$ref": "#/components/schemas/Error"}
# Answers any route can give: a malformed request, the front door's checks
# (key, host or origin, size, capacity), an unknown backend, model or path.
COMMON_ERRORS = {
    "400": "the request is malformed; the message names the field (param)",
    "401": "an API key is required and missing or wrong",
    "403": "the Host or Origin is not allowed",
    "404": "no such backend, model or route",
    "405": "the route does not take this method",
    "413": "the request body is too large",
    "503": "the daemon is busy, installing or stopping; Retry-After says when to try again",
}


def json_content(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def answer(description: str, content: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, **({"content": content} if content else {})}


def errors(**statuses: str) -> dict[str, Any]:
    """Route-specific error answers, e.g. C{errors(**{"409": "the runner is busy"})}."""
    return {status: answer(why, json_content(ERROR)) for status, why in statuses.items()}


def parameter(
    name: str, where: str, schema: Mapping[str, Any], description: str, required: bool = False
) -> Piece:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "schema": schema,
        "description": description,
    }


BACKEND = parameter("backend", "path", {"type": "string"}, "a backend name, e.g. llama.cpp")
NAME = parameter("name", "path", {"type": "string"}, "a model name, e.g. ai/smollm2")
TEXT = {"text/plain": {"schema": {"type": "string"}}}


def operation(
    summary: str,
    responses: Mapping[str, Any],
    *,
    body: Mapping[str, Any] | None = None,
    body_required: bool = True,
    parameters: Sequence[Piece] = (),
) -> Piece:
    """One operation; C{body} is its request body's content map (see L{json_content})."""
    op: Piece = {"summary": summary, "responses": dict(responses)}
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": dict(body)}
    if parameters:
        op["parameters"] = list(parameters)
    return op


def with_backend(path: str, op: Piece) -> Piece:
    """C{op}, with the C{backend} path parameter when C{path} has one."""
    if "{backend}" not in path:
        return op
    return {**op, "parameters": [BACKEND, *op.get("parameters", ())]}


def document(groups: Iterable[RouteGroup]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of C{groups}; every operation also lists L{COMMON_ERRORS}."""
    paths: dict[str, Any] = {}
    for group in groups:
        for path, operations in group.openapi()["paths"].items():
            paths.setdefault(path, {}).update(operations)
    for operations in paths.values():
        for op in operations.values():
            for status, why in COMMON_ERRORS.items():
                op["responses"].setdefault(status, answer(why, json_content(ERROR)))
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


_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")
_IMPLICIT = {"HEAD", "OPTIONS"}


def template(rule: str) -> str:
    """A werkzeug rule as an OpenAPI path: C{/models/<path:name>} is C{/models/{name}}."""
    return _CONVERTER.sub(r"{\1}", rule)


def routed(group: RouteGroup, prefix: str = "") -> set[tuple[str, str]]:
    """C{(METHOD, /openapi/{path})} for every route of C{group}'s Klein app and of its C{mounts}."""
    found: set[tuple[str, str]] = set()
    mounts: Mapping[str, RouteGroup] = group.mounts if isinstance(group, MountingGroup) else {}
    for rule in group.app.url_map.iter_rules():
        path = prefix + template(rule.rule)
        if not rule.methods:  # a branch: the group mounted there has the routes
            continue
        path = path.rstrip("/") or "/"
        found.update((method, path) for method in rule.methods - _IMPLICIT)
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

    def __init__(self, groups: Iterable[RouteGroup]):
        self.document = document([*groups, self])

    def openapi(self) -> Piece:
        return {
            "paths": {
                "/openapi.json": {
                    "get": operation(
                        "This document", {"200": answer("OpenAPI 3.1", json_content({"type": "object"}))}
                    )
                }
            }
        }

    @app.route("/openapi.json", methods=["GET"])
    def serve(self, request: IRequest) -> bytes:
        return json_body(request, self.document)
