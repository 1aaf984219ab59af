"""A runner's answer read by mrunner itself, for the APIs whose answers it reshapes.

The OpenAI routes relay a runner's bytes through the proxy. Ollama's and the
Responses API's answers are translated, and Anthropic's errors reshaped, so
these routes read the runner's answer here: a whole JSON body, server-sent
events one by one, or (Anthropic) the bytes relayed once the status is known
to be a success. Requests go through the proxy's pool of runner connections.
Cancelling whatever awaits the runner (Klein does when the client goes away)
aborts the runner connection, and llama-server stops generating.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.web.http_headers import Headers
from twisted.web.server import Request

from mrunner.errors import BadGateway, ContextExceeded, MrunnerError
from mrunner.proxy import is_event_stream, start_event_stream
from mrunner.upstream import Body, Head, RunnerConnection, RunnerPool, runner_url

_JSON = Headers({b"content-type": [b"application/json"]})


class RunnerRefused(MrunnerError):
    """The runner answered with an error status: a 4xx is kept, "not supported" (501) is the request's
    fault (400), and any other failure of the runner is a 502."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = 400 if status == 501 else status if 400 <= status < 500 else 502
        if self.status == 502:
            self.type = "server_error"


def refusal(status: int, body: bytes) -> MrunnerError:
    """The runner's error body (OpenAI-shaped from llama-server) as an error mrunner renders."""
    exceeded = ContextExceeded.from_runner(body)
    if exceeded is not None:
        return exceeded
    try:
        error = json.loads(body).get("error")
        message = error["message"] if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError, KeyError, TypeError):
        message = body.decode("utf-8", errors="replace").strip() or f"status {status}"
    return RunnerRefused(status, f"the runner refused the request: {message}")


class _Pieces(Body):
    """Keeps a response body for a reader that takes it piece by piece."""

    def __init__(self, connection: RunnerConnection) -> None:
        self._connection = connection
        self._chunks: deque[bytes] = deque()
        self._waiting: Deferred[bytes | None] | None = None
        self._ended = False
        self._why: str | None = None

    def write(self, data: bytes) -> None:
        if self._waiting is not None:
            waiting, self._waiting = self._waiting, None
            waiting.callback(data)
        else:
            self._chunks.append(data)

    def end(self) -> None:
        self._stop(None)

    def cut(self, why: str, between_chunks: bool) -> None:
        self._stop(why)

    def _stop(self, why: str | None) -> None:
        self._ended, self._why = True, why
        if self._waiting is not None:
            waiting, self._waiting = self._waiting, None
            self._finish().chainDeferred(waiting)

    def _finish(self) -> Deferred[bytes | None]:
        if self._why is None:
            return succeed(None)
        return fail(BadGateway(f"the runner stopped in the middle of the answer: {self._why}"))

    def next(self) -> Deferred[bytes | None]:
        """The next piece, C{None} at the end; L{BadGateway} when the runner went away."""
        if self._chunks:
            return succeed(self._chunks.popleft())
        if self._ended:
            return self._finish()
        self._waiting = Deferred(self._abort)
        return self._waiting

    def _abort(self, waiting: Deferred[bytes | None]) -> None:
        self._waiting = None
        self._connection.abort()


class Answer:
    """A runner's successful response, once its headers are in."""

    def __init__(self, connection: RunnerConnection, head: Head):
        self.code = head.code
        self.content_type = head.value(b"content-type") or b""
        self._connection = connection
        self._body = _Pieces(connection)
        connection.relay(self._body, framed=False)

    async def read(self) -> bytes:
        chunks = []
        while (chunk := await self._body.next()) is not None:
            chunks.append(chunk)
        return b"".join(chunks)

    async def json(self) -> Any:
        return json.loads(await self.read())

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The JSON data of each server-sent event, up to C{[DONE]} or the end.

        An error event from the runner is raised as a L{BadGateway}.
        """
        buffer = b""
        while (chunk := await self._body.next()) is not None:
            buffer += chunk
            *complete, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
            for event in complete:
                data = b"\n".join(
                    line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
                )
                if not data:
                    continue
                if data == b"[DONE]":
                    return
                value = json.loads(data)
                if isinstance(value, dict) and "error" in value:
                    raise refusal(500, data)
                yield value

    async def relay(self, request: Request) -> None:
        """Send the runner's status, content type and body to the client as they come, with backpressure."""
        request.setResponseCode(self.code)
        if self.content_type:
            request.setHeader(b"content-type", self.content_type)
        if is_event_stream(self.content_type):
            start_event_stream(request)
        producer: IPushProducer = self._connection.transport  # type: ignore[assignment]
        request.registerProducer(producer, True)
        try:
            while (chunk := await self._body.next()) is not None:
                request.write(chunk)
        finally:
            if request.channel is not None:
                request.unregisterProducer()


class RunnerClient:
    """Posts JSON to runners over their UNIX sockets, through the proxy's pool of connections."""

    def __init__(self, pool: RunnerPool):
        self._pool = pool

    async def post(self, socket: str, path: bytes, body: bytes) -> Answer:
        """POST the JSON C{body} to C{path} on the runner at C{socket}; L{RunnerRefused} for an error."""
        connection, head = await self._pool.request(b"POST", runner_url(socket, path), _JSON.copy(), body)
        answer = Answer(connection, head)
        if head.code >= 400:
            raise refusal(head.code, await answer.read())
        return answer
