"""The OpenAPI operations of the Anthropic, Responses and Ollama routes, each with its API's error shape."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from mrunner.api.documented import Operation, parameter
from mrunner.api.openapi import ERROR, Piece, answer, json_content, operation

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
#: What a catch-all route takes, to name what its API serves.
ANY_METHOD = ("GET", "HEAD", "POST", "PUT", "DELETE")
ANSWER = {
    "application/json": {"schema": {"type": "object"}},
    "text/event-stream": {"schema": {"type": "string"}},
    "application/x-ndjson": {"schema": {"type": "string"}},
}


_ARGUMENT = re.compile(r"{(\w+)}")


def compat_operation(summary: str, error: Mapping[str, Any] | None = None) -> Operation:
    """The operation of a route whose answer is its API's own: its path's parameters (but the backend's),
    an object for a body where it takes POST, and C{error}'s shape for the statuses it answers itself.

    C{summary} may name the route's C{{path}}.
    """
    # A path the URL maps cannot parse (a newline in it) gets the daemon's OpenAI-shaped 404.
    either = {"anyOf": [error, ERROR]} if error else None
    errors = {status: answer(why, json_content(either)) for status, why in STATUSES.items()} if either else {}

    def made(path: str, methods: Sequence[str]) -> Piece:
        params = [
            parameter(arg, "path", {"type": "string"}, arg)
            for arg in sorted(_ARGUMENT.findall(path))
            if arg != "backend"
        ]
        op = operation(
            summary.format(path=path), {"200": answer("the answer", ANSWER), **errors}, parameters=params
        )
        if "POST" in methods:
            op["requestBody"] = {"required": False, "content": json_content({"type": "object"})}
        return op

    return made


#: The operation of each Ollama route mrunner serves.
OLLAMAS = compat_operation("Ollama's {path}", OLLAMA_ERROR)
