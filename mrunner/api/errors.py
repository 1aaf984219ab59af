"""The one place errors become responses: the same L{MrunnerError}s, in each API's own shape.

OpenAI's routes (and mrunner's own) answer C{{"error": {"message", "type", "code"}}};
Anthropic's C{{"type": "error", "error": {"type", "message"}}} with its status codes;
Ollama's C{{"error": "message"}}. A route group picks its shape when it registers
the handlers; the front door, which answers before any route runs, picks it from
the path with L{shape_for}, as the routes declare it (L{mrunner.api.door.declared.Door}).
A route never renders an error by hand. An exception no one foresaw is a 500 in
the same shape (L{internal_error}), never twisted.web's HTML page.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

from klein import Klein
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import Resource
from werkzeug.exceptions import HTTPException

from mrunner.api.door.declared import Reach
from mrunner.errors import MethodNotAllowed, MrunnerError, NotFound

PHRASES = {status.value: status.phrase.encode() for status in HTTPStatus}
_log = Logger()

#: An API's rendering of an error: (status, body).
ErrorShape = Callable[[MrunnerError], tuple[int, Any]]


def openai_shape(error: MrunnerError) -> tuple[int, Any]:
    return error.status, error.body()


# Anthropic's documented statuses and types; mrunner's other statuses map onto the nearest one.
_ANTHROPIC = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    405: (405, "invalid_request_error"),
    409: (409, "invalid_request_error"),
    413: (413, "request_too_large"),
    422: (400, "invalid_request_error"),
    429: (429, "rate_limit_error"),
    500: (500, "api_error"),
    501: (400, "invalid_request_error"),
    502: (500, "api_error"),
    503: (529, "overloaded_error"),
    504: (504, "timeout_error"),
}


def anthropic_shape(error: MrunnerError) -> tuple[int, Any]:
    status, kind = _ANTHROPIC.get(error.status, (error.status, "api_error"))
    return status, {"type": "error", "error": {"type": kind, "message": error.message}}


def ollama_shape(error: MrunnerError) -> tuple[int, Any]:
    return error.status, {"error": error.message}


def stream_error(shape: ErrorShape, event: bytes = b"") -> Callable[[MrunnerError], bytes]:
    """C{shape}'s error as a server-sent event (named C{event} when given): a begun stream's last word."""
    name = b"event: " + event + b"\n" if event else b""
    return lambda error: name + b"data: " + json.dumps(shape(error)[1]).encode() + b"\n\n"


#: How a stream tells its client the runner stopped, in OpenAI's and in Anthropic's words.
openai_stream_error = stream_error(openai_shape)
anthropic_stream_error = stream_error(anthropic_shape, b"error")

#: How an error ends a begun stream, for the APIs whose streams are server-sent events.
STREAMED = {openai_shape: openai_stream_error, anthropic_shape: anthropic_stream_error}

#: Each API's shape by the name its routes declare (L{mrunner.api.door.declared}).
SHAPES: dict[str, ErrorShape] = {"openai": openai_shape, "anthropic": anthropic_shape, "ollama": ollama_shape}
#: (reach, path, shape's name) of each declaration with a shape of its own (L{Door.shaped}).
Shaped = Sequence[tuple[Reach, bytes, str]]


def shape_for(path: bytes, shaped: Shaped) -> ErrorShape:
    """The shape of the API that C{path} belongs to, as its routes declare it (C{shaped}): Anthropic's,
    Ollama's, else OpenAI's."""
    bare = path.rstrip(b"/")
    for reach, declared, name in shaped:
        below = path.startswith(declared + b"/")
        if (
            (reach is Reach.ENDING and bare.endswith(declared))
            or (reach is Reach.BELOW and below)
            or (reach is Reach.UNDER and (below or bare == declared))
            or (reach is Reach.EXACT and bare == declared)
        ):
            return SHAPES[name]
    return openai_shape


def json_body(request: IRequest, value: Any, status: int = 200) -> bytes:
    """Set status and content type, and encode C{value} as the response body."""
    request.setResponseCode(status, PHRASES.get(status))  # twisted.web knows no 429 or 431
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(value).encode() + b"\n"


def render_error(request: IRequest, error: MrunnerError, shape: ErrorShape | None = None) -> bytes:
    """The response for C{error} in C{shape} (by default OpenAI's), with its headers.

    C{Retry-After} goes out when a retry can help, C{WWW-Authenticate} with a 401. Where the
    answer's head is out already, as a stream's, the error is the stream's last event: its
    status is kept for the logs and the records, not sent.
    """
    if error.retry_after is not None:
        request.setHeader(b"retry-after", b"%d" % max(1, round(error.retry_after)))
    for name, value in error.headers:
        request.setHeader(name, value)
    shape = shape or openai_shape
    if getattr(request, "startedWriting", False) and shape in STREAMED:
        # A stream's head is out (its wait's notes, L{WaitNotes}): the error is its last event.
        request.setResponseCode(shape(error)[0])
        return STREAMED[shape](error)
    status, body = shape(error)
    return json_body(request, body, status)


def routing_error(request: IRequest, error: HTTPException) -> MrunnerError:
    """Werkzeug's 404 and 405 as mrunner errors."""
    message = f"{request.method.decode()} {request.uri.decode(errors='replace')}: {error.name}"
    return NotFound(message) if error.code == 404 else MethodNotAllowed(message)


def internal_error(request: IRequest, failure: Failure) -> MrunnerError:
    """A bug's failure, logged with its traceback, as the 500 the client is told (which names no detail)."""
    path = request.path.decode("latin-1")
    _log.failure("{method} {path} failed", failure, method=request.method.decode("latin-1"), path=path)
    return MrunnerError(
        f"the daemon failed on this request ({type(failure.value).__name__}); its log has the details",
        code="internal_error",
    )


def handle_json_errors(app: Klein, shape: ErrorShape = openai_shape) -> None:
    """Register handlers on C{app} that render its errors in C{shape}."""

    @app.handle_errors(MrunnerError)
    def mrunner_error(self: object, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        assert isinstance(error, MrunnerError)
        return render_error(request, error, shape)

    @app.handle_errors(HTTPException)
    def route_error(self: object, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        assert isinstance(error, HTTPException)
        return render_error(request, routing_error(request, error), shape)

    @app.handle_errors(Exception)  # the last: the two above come first
    def unexpected(self: object, request: IRequest, failure: Failure) -> bytes:
        return render_error(request, internal_error(request, failure), shape)


class Refusal(Resource):
    """Answers a request with one client error, without running any route.

    With C{close}, the connection closes after it: the front door refuses before
    reading the body, which must then not be taken for the next request. The error
    is told in the shape of the request path's API, as C{shaped} declares them.
    """

    isLeaf = True

    def __init__(self, error: MrunnerError, close: bool = False, shaped: Shaped = ()):
        super().__init__()
        self._error = error
        self._close = close
        self._shaped = shaped

    def render(self, request: IRequest) -> bytes:
        if self._close:
            request.setHeader(b"connection", b"close")
        return render_error(request, self._error, shape_for(request.path, self._shaped))
