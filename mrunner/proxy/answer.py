"""A runner's answer once its head is in, and its body taken once: read whole, as events, or relayed.

The forwarder (L{mrunner.proxy.forwarder}) relays it; Ollama's and the
Responses API's transforms read it here: a whole JSON body, or server-sent
events one by one. Cancelling whatever awaits the runner (Klein does when the
client goes away) aborts the runner connection, and llama-server stops
generating.

An answer's body waits in its connection until it is taken: take it at once.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed

from mrunner.errors import CacheFull, ContextExceeded, MrunnerError
from mrunner.proxy.connection import BodyReceiver, RunnerConnection
from mrunner.proxy.relay import Observer, stopped_midway
from mrunner.proxy.wire import Head


class RunnerRefused(MrunnerError):
    """The runner answered with an error status: a 4xx is kept, "not supported" (501) is the request's
    fault (400), and any other failure of the runner is a 502."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message, code=code, param=param)
        self.status = 400 if status == 501 else status if 400 <= status < 500 else 502
        if self.status == 502:
            self.type = "server_error"


def refusal(status: int, body: bytes) -> MrunnerError:
    """The runner's error body (OpenAI-shaped from llama-server) as an error mrunner renders: the one
    reading of a refusal, L{ContextExceeded} and L{CacheFull} included. Its C{code} and C{param},
    where they are OpenAI's strings (whisper-server's "invalid_file" and "file"), are kept."""
    exceeded = ContextExceeded.from_runner(body) or CacheFull.from_runner(status, body)
    if exceeded is not None:
        return exceeded
    try:
        error = json.loads(body).get("error")
        message = error["message"] if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError, KeyError, TypeError):
        error, message = None, body.decode("utf-8", errors="replace").strip() or f"status {status}"
    said = error if isinstance(error, dict) else {}
    code, param = (said.get(key) if isinstance(said.get(key), str) else None for key in ("code", "param"))
    return RunnerRefused(status, f"the runner refused the request: {message}", code, param)


class _Pieces(BodyReceiver):
    """Keeps an answer's body for a reader that takes it piece by piece (and shows C{observer} each)."""

    def __init__(self, connection: RunnerConnection, observer: Observer | None) -> None:
        self._connection = connection
        self._observer = observer
        self._chunks: deque[bytes] = deque()
        self._waiting: Deferred[bytes | None] | None = None
        self._ended = False
        self._why: str | None = None

    def write(self, data: bytes) -> None:
        if self._observer is not None:
            self._observer.write(data)
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
        return fail(stopped_midway(self._why))

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
    """A runner's answer, once its head is in (L{RunnerPool.request}); its body is taken once.

    C{observer} (a key's meter) sees the body as it comes, however it is taken (L{Forwarder.forward}).
    """

    def __init__(self, connection: RunnerConnection, head: Head):
        self.head = head
        self.code = head.code
        self.connection = connection
        self.observer: Observer | None = None
        self._pieces: _Pieces | None = None

    @property
    def content_type(self) -> bytes:
        return self.head.value(b"content-type") or b""

    def _next(self) -> Deferred[bytes | None]:
        if self._pieces is None:
            self._pieces = _Pieces(self.connection, self.observer)
            self.connection.relay(self._pieces, framed=False)
        return self._pieces.next()

    async def read(self) -> bytes:
        """The whole body; L{BadGateway} when the runner stops before its end."""
        chunks = []
        while (chunk := await self._next()) is not None:
            chunks.append(chunk)
        return b"".join(chunks)

    async def json(self) -> Any:
        return json.loads(await self.read())

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The JSON data of each server-sent event, up to C{[DONE]} or the end.

        An error event from the runner is raised as a L{BadGateway}.
        """
        buffer = b""
        while (chunk := await self._next()) is not None:
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
