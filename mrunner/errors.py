"""Errors that reach a client: each knows its HTTP status and OpenAI error type.

Every layer raises these; only the api layer turns them into responses, so the
scheduling core and the store never import Klein.
"""

from __future__ import annotations

import json


class MrunnerError(Exception):
    """A failure a client is told about as ``{"error": {"message", "type", "code"[, "param"]}}``."""

    status = 500
    type = "server_error"
    code: str | None = None
    # Response headers the status calls for, such as a 401's WWW-Authenticate.
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retry_after: float | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.param = param

    def body(self) -> dict[str, object]:
        """OpenAI's error object; C{param} (the offending field) only when one is to blame."""
        error: dict[str, object] = {"message": self.message, "type": self.type, "code": self.code}
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}


class BadRequest(MrunnerError):
    status = 400
    type = "invalid_request_error"


class ContextExceeded(BadRequest):
    """A conversation longer than the runner's context: the person starts a new one or drops old turns.

    llama-server refuses it with a 400 of type C{exceed_context_size_error}
    ("request (5700 tokens) exceeds the available context size (4096 tokens),
    try increasing it"); every API answers this instead, in its own shape.
    """

    code = "context_length_exceeded"

    def __init__(self, tokens: int | None, context: int, at_least: bool = False):
        size = f" ({'at least ' if at_least else ''}{tokens} tokens)" if tokens else ""
        super().__init__(
            f"the conversation{size} no longer fits in the model's context of {context} tokens:"
            " start a new conversation, or drop its oldest turns; or raise the model's context size"
            " (mrunner configure --context-size, or context_size in tap.conf), up to the context it"
            " was trained for"
        )
        self.context = context

    @classmethod
    def from_runner(cls, body: bytes) -> ContextExceeded | None:
        """This error, if C{body} is llama-server's refusal of a request longer than its context."""
        try:
            error = json.loads(body).get("error")
            if error.get("type") != "exceed_context_size_error":
                return None
            tokens = error.get("n_prompt_tokens")
            return cls(tokens if isinstance(tokens, int) else None, int(error["n_ctx"]))
        except (ValueError, AttributeError, KeyError, TypeError):
            return None


class Unauthorized(MrunnerError):
    """No API key, or a wrong one, where the daemon requires one."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"
    headers = ((b"www-authenticate", b'Bearer realm="mrunner"'),)


class Forbidden(MrunnerError):
    """A Host, an Origin or a key that may not use this route."""

    status = 403
    type = "permission_error"


class NotFound(MrunnerError):
    status = 404
    type = "not_found_error"


class MethodNotAllowed(MrunnerError):
    status = 405
    type = "invalid_request_error"


class Conflict(MrunnerError):
    status = 409
    type = "conflict_error"


class PayloadTooLarge(MrunnerError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UriTooLong(MrunnerError):
    status = 414
    type = "invalid_request_error"
    code = "request_line_too_long"


class Unprocessable(MrunnerError):
    status = 422
    type = "invalid_request_error"


class TooManyRequests(MrunnerError):
    status = 429
    type = "rate_limit_error"


class HeadersTooLarge(MrunnerError):
    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"


class RunnerFailed(MrunnerError):
    """The runner process could not start; the message carries its stderr tail."""

    status = 500
    type = "server_error"
    code = "runner_failed"


class BadGateway(MrunnerError):
    """The runner died or could not be reached before it answered."""

    status = 502
    type = "server_error"
    code = "runner_unreachable"


class Unavailable(MrunnerError):
    """Try again later: installing, backing off, queue full, stopping."""

    status = 503
    type = "server_error"
    code = "unavailable"


class CacheFull(Unavailable):
    """llama-server's 500 "Context size has been exceeded": its KV pool had no room for a request.

    Each runner's pool holds a whole context per slot, so this should not
    happen; where it does, the request was not served and a retry can be: a
    503 with C{Retry-After}, never the runner's 500.
    """

    code = "runner_cache_full"

    def __init__(self) -> None:
        super().__init__(
            "the runner's cache had no room for this request beside the others it serves; retry",
            retry_after=1.0,
        )

    @classmethod
    def from_runner(cls, status: int, body: bytes) -> CacheFull | None:
        """This error, if C{body} is llama-server's 500 for a full KV pool."""
        return cls() if status == 500 and b"Context size has been exceeded" in body else None
