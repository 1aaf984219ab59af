"""Serve before swapping with real llama-server processes: two models under a budget that holds one,
each kept busy by two clients, share each load among many requests, and no request waits for ever."""

from __future__ import annotations

import json
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.internet.task import deferLater

from mrunner.runners.runner import Runner
from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.daemon import http
from tests.support.llamacpp_cases import ONE_TINY_MODEL, LlamaCppTestCase

A, B = "ai/tiny-a", "ai/tiny-b"
SECONDS = 12.0
MAX_WAIT = 3.0


class ServeBeforeSwappingTests(LlamaCppTestCase):
    timeout = 240

    async def test_two_busy_models_share_each_load(self) -> None:
        await self.start(f'{ONE_TINY_MODEL}\nmax_wait = "{MAX_WAIT:g}s"', parallel=2)
        for name, seed in ((A, 1), (B, 2)):
            path = self.home / f"{seed}.gguf"
            write_tiny_llama(path, seed=seed)
            await self.daemon.import_model(name, path)
        pacing = self.daemon.scheduler.loader.pacing
        loads: list[str] = []
        counted = pacing.loaded

        def loaded(runner: Runner) -> None:
            loads.append(runner.model_name)
            counted(runner)

        pacing.loaded = loaded  # type: ignore[method-assign]
        ends = time.monotonic() + SECONDS

        async def client(model: str) -> list[float]:
            latencies = []
            while time.monotonic() < ends:
                began = time.monotonic()
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                code, answer = await self.post("/v1/chat/completions", body)
                self.assertEqual(code, 200, answer)
                latencies.append(time.monotonic() - began)
            return latencies

        async def watch() -> list[dict[str, Any]]:
            """Every row of /engines/ps that shows requests waiting."""
            seen = []
            while time.monotonic() < ends:
                response = await http.get(self.daemon.url + "/engines/ps")
                seen += [row for row in json.loads(await response.text()) if row.get("waiting")]
                await deferLater(reactor, 0.2)
            return seen

        watching = ensureDeferred(watch())
        results = await DeferredList([ensureDeferred(client(m)) for m in (A, A, B, B)], fireOnOneErrback=True)
        shown = await watching
        self.assertTrue(shown, "/engines/ps showed the queue")
        for row in shown:
            self.assertIn(row["model_name"], {f"{A}:latest", f"{B}:latest"})
            self.assertGreaterEqual(row["oldest_wait"], 0)
        latencies = [seconds for _, result in results for seconds in result]
        self.assertGreaterEqual(len(set(loads)), 2, f"both models were served: {loads}")
        self.assertGreaterEqual(len(latencies) / len(loads), 4, f"{len(latencies)} requests, loads: {loads}")
        self.assertLess(max(latencies), 60)
        self.assertLess(max(latencies), MAX_WAIT + 10, "max_wait, and the loads and requests in the way")
