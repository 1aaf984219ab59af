"""The OpenAPI vocabulary each route group declares its operations in (L{operation}, L{answer},
L{json_content}, L{errors}), shared by every API; the document is assembled from those
declarations by L{mrunner.api.manage.openapi}."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mrunner.api.documented import parameter
from mrunner.api.door.route_group import Piece

__all__ = [
    "COMMON_ERRORS",
    "ERROR",
    "ERROR_SCHEMA",
    "NAME",
    "TEXT",
    "Piece",
    "answer",
    "errors",
    "json_content",
    "operation",
    "parameter",
]

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
