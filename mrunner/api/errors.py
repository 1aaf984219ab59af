"""Every error a client sees is rendered here, in the shape of the API the request came in on.

That is OpenAI's C{{"error": {"message", "type", "code"}}} on every route today;
L{error_document} is the one place that picks a shape from the request's path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import Resource
from werkzeug.exceptions import HTTPException

from mrunner.errors import MethodNotAllowed, MrunnerError, NotFound


def json_body(request: IRequest, value: Any, status: int = 200) -> bytes:
    """Set status and content type, and encode C{value} as the response body."""
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(value).encode() + b"\n"


def error_document(path: bytes, error: MrunnerError) -> dict[str, object]:
    """The JSON body that tells a client on C{path} about C{error}."""
    return error.body()


def render_error(request: IRequest, error: MrunnerError) -> bytes:
    """Status, headers (C{Retry-After} when a retry can help) and body for C{error}."""
    if error.retry_after is not None:
        request.setHeader(b"retry-after", b"%d" % max(1, round(error.retry_after)))
    for name, value in error.headers:
        request.setHeader(name, value)
    return json_body(request, error_document(request.path, error), error.status)


def error_response(request: IRequest, failure: Failure) -> bytes:
    """The response for a L{MrunnerError} a route raised."""
    error = failure.value
    assert isinstance(error, MrunnerError)
    return render_error(request, error)


def routing_error_response(request: IRequest, failure: Failure) -> bytes:
    """Werkzeug's 404 and 405, rendered as the daemon's own errors."""
    error = failure.value
    assert isinstance(error, HTTPException)
    message = f"{request.method.decode()} {request.uri.decode(errors='replace')}: {error.name}"
    kind = MethodNotAllowed if error.code == 405 else NotFound
    return render_error(request, kind(message))


def handle_json_errors(app: Klein) -> None:
    """Register the JSON error handlers on C{app}."""
    handlers: list[tuple[type[Exception], Callable[..., bytes]]] = [
        (MrunnerError, error_response),
        (HTTPException, routing_error_response),
    ]
    for kind, handler in handlers:
        app.handle_errors(kind)(lambda self, request, failure, handler=handler: handler(request, failure))


class Refusal(Resource):
    """Answers a request with one client error, without running any route.

    With C{close}, the connection closes after it: the front door refuses before
    reading the body, which must then not be taken for the next request.
    """

    isLeaf = True

    def __init__(self, error: MrunnerError, close: bool = False):
        super().__init__()
        self._error = error
        self._close = close

    def render(self, request: IRequest) -> bytes:
        if self._close:
            request.setHeader(b"connection", b"close")
        return render_error(request, self._error)
