"""A runner's answer read by mrunner itself, for the APIs whose answers it reshapes.

The OpenAI routes relay a runner's bytes through the proxy. Ollama's and the
Responses API's answers are translated, and Anthropic's errors reshaped, so
these routes read the runner's answer here: a whole JSON body, server-sent
events one by one, or (Anthropic) the bytes relayed once the status is known
to be a success. Requests go through the same pooled C{Agent} as the proxy's.
Cancelling whatever awaits the runner (Klein does when the client goes away)
aborts the runner connection, and llama-server stops generating.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.error import ConnectError, ConnectingCancelledError
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import (
    Agent,
    RequestNotSent,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from twisted.web.server import Request

from mrunner.errors import BadGateway, MrunnerError
from mrunner.proxy import BytesBody, is_event_stream, runner_url, start_event_stream

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


def refusal(status: int, body: bytes) -> RunnerRefused:
    """The runner's error body (OpenAI-shaped from llama-server) as an error mrunner renders."""
    try:
        error = json.loads(body).get("error")
        message = error["message"] if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError, KeyError, TypeError):
        message = body.decode("utf-8", errors="replace").strip() or f"status {status}"
    return RunnerRefused(status, f"the runner refused the request: {message}")


class _Body(Protocol):
    """Keeps a response body for a reader that takes it chunk by chunk."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._waiting: Deferred[bytes | None] | None = None
        self._end: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        if self._waiting is not None:
            waiting, self._waiting = self._waiting, None
            waiting.callback(data)
        else:
            self._chunks.append(data)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self._end = reason
        if self._waiting is not None:
            waiting, self._waiting = self._waiting, None
            self._finish().chainDeferred(waiting)

    def _finish(self) -> Deferred[bytes | None]:
        assert self._end is not None
        if self._end.check(ResponseDone, PotentialDataLoss):
            return succeed(None)
        return fail(
            BadGateway(f"the runner stopped in the middle of the answer: {self._end.getErrorMessage()}")
        )

    def next(self) -> Deferred[bytes | None]:
        """The next chunk, C{None} at the end; L{BadGateway} when the runner went away."""
        if self._chunks:
            return succeed(self._chunks.popleft())
        if self._end is not None:
            return self._finish()
        self._waiting = Deferred(self._abort)
        return self._waiting

    def _abort(self, waiting: Deferred[bytes | None]) -> None:
        self._waiting = None
        self.transport.stopProducing()  # type: ignore[union-attr]


class Answer:
    """A runner's successful response, once its headers are in."""

    def __init__(self, response: IResponse):
        self.response = response
        self._body = _Body()
        response.deliverBody(self._body)

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
        request.setResponseCode(self.response.code)
        kind = self.response.headers.getRawHeaders(b"content-type")
        if kind:
            request.setHeader(b"content-type", kind[0])
        if is_event_stream(self.response.headers):
            start_event_stream(request)
        producer: IPushProducer = self._body.transport  # type: ignore[assignment]
        request.registerProducer(producer, True)
        try:
            while (chunk := await self._body.next()) is not None:
                request.write(chunk)
        finally:
            if request.channel is not None:
                request.unregisterProducer()


class RunnerClient:
    """Posts JSON to runners over their UNIX sockets, through the proxy's pooled C{Agent}."""

    def __init__(self, agent: Agent):
        self._agent = agent

    async def post(self, socket: str, path: bytes, body: bytes) -> Answer:
        """POST the JSON C{body} to C{path} on the runner at C{socket}; L{RunnerRefused} for an error."""
        response = await self._send(runner_url(socket, path), body)
        answer = Answer(response)
        if response.code >= 400:
            raise refusal(response.code, await answer.read())
        return answer

    async def _send(self, url: bytes, body: bytes, retry: bool = True) -> IResponse:
        """The response once its headers are in, sent once more if a pooled connection had died.

        llama-server closes a connection after a stream while announcing
        keep-alive, so the pool may hand out one that is gone (see the proxy).
        """
        try:
            return await self._agent.request(b"POST", url, _JSON.copy(), BytesBody(body))
        except ConnectingCancelledError:
            raise CancelledError() from None
        except (ResponseNeverReceived, RequestNotSent, RequestTransmissionFailed) as e:
            if any(reason.check(CancelledError) for reason in getattr(e, "reasons", ())):
                raise CancelledError() from None
            if retry:
                return await self._send(url, body, retry=False)
            raise BadGateway(f"the runner closed the connection before answering: {e}") from None
        except ConnectError as e:
            raise BadGateway(f"the runner cannot be reached: {e}") from None
