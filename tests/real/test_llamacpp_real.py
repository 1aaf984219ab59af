"""The llama.cpp backend with real processes: the shared cached llama-server and tiny models.

These tests never build llama.cpp (minutes): they skip unless
``python -m mrunner.backends.llamacpp`` has put the pinned build in the shared
cache. Runners are started directly from C{command()}, without the scheduler.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from mrunner.backends import childprocess
from mrunner.backends.llamacpp import source
from mrunner.backends.llamacpp.backend import LlamaCppBackend
from mrunner.config import Config
from mrunner.store import gguf_meta
from mrunner.testing.tinymodel import write_tiny_llama, write_tiny_reranker
from mrunner.values.backend import COMPLETION, EMBEDDING, RERANKING, RunnerSettings
from mrunner.values.model import Model
from tests.support.daemon import short_home, unix_client
from tests.support.llamacpp_cases import cached_llama_server

MODEL = "ai/tiny:latest"


class CachedInstallTests(TestCase):
    async def test_finds_cached_build(self) -> None:
        executable = cached_llama_server()
        home = Path(self.mktemp())
        environ = {**os.environ, "PATH": "/usr/bin:/bin"}
        backend = LlamaCppBackend(Config(home=home), reactor, environ)
        reports: list[str] = []

        self.assertEqual(await backend.install(reports.append), f"llama.cpp {source.PIN}")
        self.assertEqual(backend.executable, executable)
        self.assertEqual(reports, ["looking for llama-server"])
        self.assertGreater(backend.disk_usage(), 1_000_000)


class ServeTests(TestCase):
    """llama-server started with C{command()} serves the tiny models over its UNIX socket."""

    timeout = 60

    async def start(self, mode: str, gguf: Path) -> HTTPClient:
        cached_llama_server()
        backend = LlamaCppBackend(Config(home=Path(self.mktemp())), reactor)
        await backend.install(lambda message: None)
        # UNIX socket paths must stay under 108 bytes: trial's temp paths can be longer.
        socket = str(short_home(self, "ll-") / "r.sock")
        config = gguf_meta.read(gguf).config()
        model = Model(id="sha256:" + "0" * 64, tags=(MODEL,), created=0, config=config, gguf=str(gguf))
        command = backend.command(model, mode, socket, RunnerSettings(parallel=2, threads=1))
        child = childprocess.spawn(reactor, (command.executable, *command.args), keep=30)
        self.addCleanup(self.stop, child)
        client = unix_client(socket)
        for _ in range(100):
            if child.exit is not None:
                self.fail(f"llama-server exited: {child.exit.describe()}")
            if os.path.exists(socket):
                response = await client.get("http://runner/health")
                await response.content()
                if response.code == 200:
                    return client
            await deferLater(reactor, 0.1, lambda: None)
        self.fail("llama-server did not become ready in 10s")

    async def stop(self, child: childprocess.Child) -> None:
        child.kill()
        await child.ended()

    async def post(self, client: HTTPClient, path: str, body: dict[str, Any]) -> Any:
        response = await client.post(f"http://runner{path}", json=body)
        payload = json.loads(await response.content())
        self.assertEqual(response.code, 200, payload)
        return payload

    def tiny(self, writer: Any = write_tiny_llama) -> Path:
        path = Path(self.mktemp()).with_suffix(".gguf")
        writer(path)
        return path

    async def test_chat_and_completion(self) -> None:
        client = await self.start(COMPLETION, self.tiny())
        messages = [{"role": "user", "content": "hello"}]
        chat = await self.post(
            client, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 4}
        )
        self.assertEqual(chat["model"], MODEL)
        self.assertEqual(chat["choices"][0]["finish_reason"], "length")
        self.assertEqual(chat["usage"]["completion_tokens"], 4)
        self.assertTrue(chat["choices"][0]["message"]["content"].strip())
        completion = await self.post(
            client, "/v1/completions", {"model": MODEL, "prompt": "the", "max_tokens": 3}
        )
        self.assertEqual(completion["usage"]["completion_tokens"], 3)

    async def test_embeddings(self) -> None:
        client = await self.start(EMBEDDING, self.tiny())
        inputs = ["hello", "the model"]
        result = await self.post(client, "/v1/embeddings", {"model": MODEL, "input": inputs})
        self.assertEqual([len(item["embedding"]) for item in result["data"]], [64, 64])

    async def test_rerank(self) -> None:
        client = await self.start(RERANKING, self.tiny(write_tiny_reranker))
        documents = ["the model", "hot water"]
        result = await self.post(
            client, "/v1/rerank", {"model": MODEL, "query": "hello", "documents": documents}
        )
        self.assertEqual(sorted(item["index"] for item in result["results"]), [0, 1])
        for item in result["results"]:
            self.assertTrue(0 < item["relevance_score"] < 1)
