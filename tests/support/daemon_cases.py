"""The bases of the tests that run the daemon with the stand-in runner (tests/support/runner_program.py)."""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.protocol import Protocol
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, ResponseDone
from twisted.web.http_headers import Headers

from tests.support.daemon import InProcessDaemon, http, short_home, write_config
from tests.support.ggufs import write_tiny_gguf

MODEL = "ai/tiny:latest"


HI = [{"role": "user", "content": "hi"}]


class Events(Protocol):
    """Collects a streamed body and tells the test when the Nth chunk has arrived."""

    def __init__(self) -> None:
        self.data = b""
        self.done: Deferred[None] = Deferred()
        self._waiting: list[tuple[bytes, Deferred[None]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        for marker, d in list(self._waiting):
            if marker in self.data:
                self._waiting.remove((marker, d))
                d.callback(None)

    def arrived(self, marker: bytes) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if marker in self.data:
            d.callback(None)
        else:
            self._waiting.append((marker, d))
        return d

    def connectionLost(self, reason: Any) -> None:
        self.done.callback(reason.check(ResponseDone))


class DaemonTestCase(TestCase):
    timeout = 60
    config_text = ""
    runner_args: tuple[str, ...] = ()
    head_parser: str | None = None  # [http] head_parser, when not the default

    async def start(self) -> None:
        self.home = short_home(self)
        self.daemon = InProcessDaemon(
            write_config(self.home, self.config_text, self.runner_args, self.head_parser)
        )
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))
        gguf = self.home / "tiny.gguf"
        write_tiny_gguf(gguf)
        await self.daemon.import_model(MODEL, gguf)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
        response = await http.post(self.daemon.url + path, json=body)
        text = await response.text()
        try:
            return response.code, json.loads(text), response.headers
        except ValueError:
            return response.code, text, response.headers

    async def open_stream(self, body: dict[str, Any]) -> tuple[Any, Events]:
        agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
        response = await agent.request(
            b"POST",
            (self.daemon.url + "/engines/v1/chat/completions").encode(),
            Headers({b"content-type": [b"application/json"]}),
            FileBodyProducer(BytesIO(json.dumps({**self.chat(stream=True), **body}).encode())),
        )
        events = Events()
        response.deliverBody(events)
        return response, events

    async def gated_stream(self) -> tuple[str, Events]:
        """A stream of two events that has sent its first; touch C{gate + "1"} to release the second."""
        gate = str(self.home / "gate")
        Path(f"{gate}0").touch()
        _, events = await self.open_stream({"test": {"events": 2, "gate": gate}})
        await events.arrived(b"tok0")
        return gate, events

    def runner_pids(self) -> list[int]:
        return [runner.pid for runner in self.daemon.scheduler.snapshot()]

    def chat(self, **body: Any) -> dict[str, Any]:
        return {"model": MODEL, "messages": HI, **body}


class CompatDaemonTestCase(TestCase):
    timeout = 60
    head_parser: str | None = None  # [http] head_parser, when not the default

    async def start(self, text: str = "") -> None:
        self.home = short_home(self)
        self.gate = str(self.home / "gate")
        config = write_config(
            self.home,
            text,
            ("--gate", self.gate, "--requests", str(self.home / "requests")),
            self.head_parser,
        )
        self.daemon = InProcessDaemon(config)
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))
        gguf = self.home / "tiny.gguf"
        write_tiny_gguf(gguf)
        await self.daemon.import_model(MODEL, gguf)

    def open_gates(self, count: int = 5) -> None:
        for i in range(count):
            Path(f"{self.gate}{i}").touch()

    async def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await http.post(self.daemon.url + path, data=data, headers=headers)
        text = await response.text()
        try:
            return response.code, json.loads(text)
        except ValueError:
            return response.code, text

    async def open_stream(self, path: str, body: dict[str, Any]) -> Events:
        agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
        response = await agent.request(
            b"POST",
            (self.daemon.url + path).encode(),
            Headers({b"content-type": [b"application/json"]}),
            FileBodyProducer(BytesIO(json.dumps(body).encode())),
        )
        self.assertEqual(response.code, 200)
        events = Events()
        response.deliverBody(events)
        return events

    def sent_to_runner(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.home / "requests").read_text().splitlines()]
