"""A small HTTP/1.1 client on asyncio that timestamps every server-sent event as it arrives.

The same code reaches every path, so only the server side differs. It is
asyncio with h11 rather than Twisted because each scenario runs its own event
loop (``asyncio.run``) between blocking steps that start and stop processes,
and a Twisted reactor cannot be started twice; and rather than httpx because
one process must drive a thousand streams while costing little CPU, and
because the first byte and each event need their own arrival time.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11

#: Seconds any one exchange may take, so a wedged server fails a stream instead of hanging the bench.
TIMEOUT = 120.0


@dataclass
class Exchange:
    """One streamed request, as C{perf_counter} times: when sent, first byte, each token event."""

    sent_at: float
    status: int | None = None
    first_byte_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    events: int = 0
    done: bool = False
    error: str | None = None

    def ms_after_sending(self, at: float | None) -> float:
        """Milliseconds from sending the request to C{at}: the first byte, or a token."""
        if at is None:
            raise BadResponse("a stream without a first byte")
        return (at - self.sent_at) * 1000

    @property
    def failure(self) -> str | None:
        """Why this exchange is not a complete stream, or None if it is."""
        if self.error:
            return self.error
        if self.status != 200:
            return f"HTTP {self.status}"
        if not self.done:
            return "stream ended without [DONE]"
        return None


class _Protocol(asyncio.Protocol):
    """Sends one request and parses the answer as it arrives: status, body, events."""

    def __init__(self, request: bytes, exchange: Exchange, finished: asyncio.Future[None]):
        self._request = request
        self._exchange = exchange
        self._finished = finished
        self._http = h11.Connection(h11.CLIENT)
        self._pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._exchange.sent_at = time.perf_counter()
        transport.write(self._request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self._exchange.first_byte_at is None:
            self._exchange.first_byte_at = now
        try:
            self._http.receive_data(data)
            while (event := self._http.next_event()) is not h11.NEED_DATA:
                if isinstance(event, h11.Response):
                    self._exchange.status = event.status_code
                elif isinstance(event, h11.Data):
                    self._body(bytes(event.data), now)
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    self._finish()
                    return
        except (h11.RemoteProtocolError, ValueError) as e:
            self._finish(f"bad answer: {e}")

    def _body(self, data: bytes, now: float) -> None:
        """Split the body into server-sent events; note when each token arrived."""
        *events, self._pending = (self._pending + data).split(b"\n\n")
        for event in events:
            payload = event.removeprefix(b"data: ")
            if payload == b"[DONE]":
                self._exchange.done = True
                continue
            self._exchange.events += 1
            chunk = json.loads(payload)
            if "error" in chunk:
                self._finish(f"error event: {chunk['error']}")
            elif any(choice.get("delta", {}).get("content") for choice in chunk.get("choices", ())):
                self._exchange.token_times.append(now)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(None if self._exchange.status else f"connection lost: {exc}")

    def _finish(self, error: str | None = None) -> None:
        if not self._finished.done():
            self._exchange.error = error
            self._finished.set_result(None)


def _request(url: str, path: str, body: dict[str, Any]) -> tuple[str, int, bytes]:
    """Host, port and the bytes of a POST of C{body} as JSON, closing the connection after."""
    parts = urlsplit(url)
    content = json.dumps(body).encode()
    headers = [
        ("Host", parts.netloc),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(content))),
        ("Connection", "close"),
    ]
    http = h11.Connection(h11.CLIENT)
    data = http.send(h11.Request(method="POST", target=path, headers=headers))
    data += http.send(h11.Data(data=content)) + http.send(h11.EndOfMessage())
    return parts.hostname or "", parts.port or 80, data


async def exchange(url: str, path: str, body: dict[str, Any]) -> Exchange:
    """POST C{body} to C{url}C{path} on a new connection and read the whole answer.

    A new connection each time: ``llama-server`` closes its connection after a
    stream anyway, and every path then pays the same loopback connect.
    """
    host, port, request = _request(url, path, body)
    loop = asyncio.get_running_loop()
    result = Exchange(sent_at=time.perf_counter())
    finished: asyncio.Future[None] = loop.create_future()
    try:
        transport, _ = await loop.create_connection(lambda: _Protocol(request, result, finished), host, port)
    except OSError as e:
        result.error = f"connect: {e}"
        return result
    try:
        await asyncio.wait_for(finished, TIMEOUT)
    except TimeoutError:
        result.error = f"no complete answer in {TIMEOUT:.0f}s"
    finally:
        transport.close()
    return result


def run(url: str, path: str, body: dict[str, Any]) -> Exchange:
    """L{exchange} from blocking code; L{BadResponse} unless it is a complete stream."""
    result = asyncio.run(exchange(url, path, body))
    if result.failure:
        raise BadResponse(f"{url}{path}: {result.failure}")
    return result


class BadResponse(Exception):
    """A path answered, but not with the complete stream every path must send."""
