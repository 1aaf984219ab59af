"""The OpenAPI pieces of the Anthropic, Responses and Ollama route groups, each with its own error shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from klein import Klein

from mrunner.api.manage.openapi import (
    ERROR,
    Piece,
    answer,
    json_content,
    operation,
    parameter,
    template,
    with_backend,
)

ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
OLLAMA_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
#: Statuses these routes answer themselves, in their API's shape.
STATUSES = {
    "400": "the request is malformed or asks for what mrunner does not serve; the message names it",
    "404": "no such model, backend, response or route",
    "405": "the route does not take this method",
    "413": "the request body is too large",
    "500": "the runner failed to start",
    "502": "the runner died or could not be reached",
    "503": "busy, installing or stopping (Anthropic: 529 overloaded_error); Retry-After says when",
}
ANSWER = {
    "application/json": {"schema": {"type": "object"}},
    "text/event-stream": {"schema": {"type": "string"}},
    "application/x-ndjson": {"schema": {"type": "string"}},
}


def describe(app: Klein, summaries: Mapping[str, str], error: Mapping[str, Any] | None = None) -> Piece:
    """Every route of C{app}, summarised by its endpoint's name (less any C{_N} suffix)."""
    # A path the URL maps cannot parse (a newline in it) gets the daemon's OpenAI-shaped 404.
    either = {"anyOf": [error, ERROR]} if error else None
    errors = {status: answer(why, json_content(either)) for status, why in STATUSES.items()} if either else {}
    paths: dict[str, Any] = {}
    for rule in app.url_map.iter_rules():
        path = template(rule.rule)
        name = (
            str(rule.endpoint).rsplit("_", 1)[0] if str(rule.endpoint)[-1].isdigit() else str(rule.endpoint)
        )
        params = [
            parameter(arg, "path", {"type": "string"}, arg)
            for arg in sorted(rule.arguments)
            if arg != "backend"
        ]
        op = operation(summaries[name], {"200": answer("the answer", ANSWER), **errors}, parameters=params)
        if "POST" in (rule.methods or ()):
            op["requestBody"] = {"required": False, "content": json_content({"type": "object"})}
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = with_backend(path, op)
    return {"paths": paths}
