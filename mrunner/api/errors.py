"""Every error a client sees is OpenAI-shaped JSON: C{{"error": {"message", "type", "code"}}}."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from werkzeug.exceptions import HTTPException

from mrunner.errors import MrunnerError


def json_body(request: IRequest, value: Any, status: int = 200) -> bytes:
    """Set status and content type, and encode C{value} as the response body."""
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(value).encode() + b"\n"


def error_response(request: IRequest, failure: Failure) -> bytes:
    """The response for a L{MrunnerError} raised by a route."""
    error = failure.value
    assert isinstance(error, MrunnerError)
    return render_error(request, error)


def render_error(request: IRequest, error: MrunnerError) -> bytes:
    """The response for C{error}, with C{Retry-After} when a retry can help."""
    if error.retry_after is not None:
        request.setHeader(b"retry-after", b"%d" % max(1, round(error.retry_after)))
    return json_body(request, error.body(), error.status)


def routing_error_response(request: IRequest, failure: Failure) -> bytes:
    """Werkzeug's 404 and 405, in the same JSON shape."""
    error = failure.value
    assert isinstance(error, HTTPException)
    status = error.code or 500
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    message = f"{request.method.decode()} {request.uri.decode(errors='replace')}: {error.name}"
    return json_body(request, {"error": {"message": message, "type": kind, "code": None}}, status)


def handle_json_errors(app: Klein) -> None:
    """Register the JSON error handlers on C{app}."""
    handlers: list[tuple[type[Exception], Callable[..., bytes]]] = [
        (MrunnerError, error_response),
        (HTTPException, routing_error_response),
    ]
    for kind, handler in handlers:
        app.handle_errors(kind)(lambda self, request, failure, handler=handler: handler(request, failure))
