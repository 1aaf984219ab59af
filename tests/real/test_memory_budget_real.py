"""The memory budget with real llama-server processes: the estimate, eviction, draining, swapping.

Two tiny models of about 24 MiB each share a 40 MiB budget, so only one can
be loaded at a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred, gatherResults
from twisted.internet.task import LoopingCall, deferLater

from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.daemon import http
from tests.support.held import Held
from tests.support.llamacpp_cases import ONE_TINY_MODEL, LlamaCppTestCase, smollm2

A, B = "ai/tiny-a", "ai/tiny-b"


def live_children() -> set[int]:
    """Processes this one started that are still running (not yet exited)."""
    me = os.getpid()
    children = Path(f"/proc/{me}/task/{me}/children").read_text().split()
    alive = set()
    for pid in children:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in "ZX":
            alive.add(int(pid))
    return alive


class BudgetTestCase(LlamaCppTestCase):
    async def two_models(self) -> None:
        await self.start(ONE_TINY_MODEL, parallel=2)
        for name, seed in ((A, 1), (B, 2)):
            path = self.home / f"{seed}.gguf"
            write_tiny_llama(path, seed=seed)
            await self.daemon.import_model(name, path)

    async def chat(self, model: str, max_tokens: int = 4, **extra: Any) -> tuple[int, Any]:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
        return await self.post("/v1/chat/completions", {**body, **extra})

    def loaded(self) -> list[str]:
        return [runner.model_name for runner in self.daemon.scheduler.snapshot()]


class EstimateTests(LlamaCppTestCase):
    async def test_estimate_is_within_a_quarter_of_measured_memory(self) -> None:
        """The estimate is of a full pool: llama-server reserves its compute buffer (the attention
        mask over every cell, 8 MiB of the tiny model's 30 with two 4,096-token slots) and writes it
        as the cells fill. So the tiny model's two slots are filled (~3,800 tokens each, at once);
        SmolLM2's weights and cache dwarf its mask, and one question does."""
        await self.start()
        await self.tiny()
        await self.daemon.import_model("ai/smollm2", smollm2())
        for name, slots, words in (("ai/tiny", 2, 380), ("ai/smollm2", 1, 0)):
            asked = [
                self.post(
                    "/v1/chat/completions",
                    {
                        "model": name,
                        "messages": [{"role": "user", "content": f"What is {n}+2? " + "the water " * words}],
                        "max_tokens": 8,
                    },
                )
                for n in range(slots)
            ]
            for code, answer in await gatherResults([ensureDeferred(each) for each in asked]):
                self.assertEqual(code, 200, answer)
            code, (runner,) = await self.get("/engines/ps")
            estimate, measured = runner["memory_estimate"], runner["memory_measured"]
            self.assertLess(abs(measured - estimate), estimate / 4, f"{name}: {estimate=} {measured=}")
            self.assertGreaterEqual(runner["memory"], estimate, "the budget counts at least the estimate")
            await self.post("/engines/unload", {"all": True})

    async def get(self, path: str) -> tuple[int, Any]:
        response = await http.get(self.daemon.url + path)
        return response.code, json.loads(await response.text())


class EvictionTests(BudgetTestCase):
    async def test_the_second_model_evicts_the_idle_first(self) -> None:
        await self.two_models()
        self.assertEqual((await self.chat(A))[0], 200)
        (first,) = self.daemon.scheduler.snapshot()
        self.assertEqual((await self.chat(B))[0], 200)
        self.assertEqual(self.loaded(), [f"{B}:latest"])
        self.assertNotIn(first.pid, live_children(), "the first runner has exited")

    async def test_the_second_model_waits_for_a_stream_to_finish(self) -> None:
        """B is queued while A streams, and loads only once A's stream has ended, whole.

        The client reads nothing of A's stream until B is seen waiting: with the
        20 most likely tokens beside each one, the answer (7.5 MB) is more than the sockets
        hold, so A is still busy then, however fast this machine generates.
        """
        await self.two_models()
        body = {
            "model": A,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4000,
            "stream": True,
            "logprobs": True,
            "top_logprobs": 20,
        }
        response = await http.post(self.daemon.url + "/v1/chat/completions", json=body)
        self.assertEqual(response.code, 200)
        stream = Held()
        response.deliverBody(stream)
        order: list[str] = []
        stream.done.addCallback(lambda _: order.append("a"))
        second = ensureDeferred(self.chat(B)).addCallback(lambda result: order.append("b") or result)
        while self.daemon.scheduler.queued() == 0 and not second.called:
            await deferLater(reactor, 0.01)
        runners = [(runner.model_name, runner.in_use) for runner in self.daemon.scheduler.snapshot()]
        self.assertEqual(runners, [(f"{A}:latest", 1)], "A is busy, and kept, while B waits")
        self.assertEqual(order, [])
        stream.transport.resumeProducing()
        await stream.done
        code, answer = await second
        self.assertEqual(code, 200, answer)
        self.assertEqual(order, ["a", "b"], "b waited for a's stream")
        events = [line[6:] for line in stream.data.split(b"\n") if line.startswith(b"data: ")]
        self.assertEqual(events[-1], b"[DONE]")
        chunks = [json.loads(event)["choices"] for event in events[:-1]]
        tokens = [c[0]["delta"].get("content") for c in chunks if c and c[0]["delta"].get("content")]
        self.assertEqual(len(tokens), 4000, "the stream was not cut")
        self.assertEqual(self.loaded(), [f"{B}:latest"])


class SwapTests(BudgetTestCase):
    timeout = 300

    async def test_alternating_clients_never_have_both_runners_alive(self) -> None:
        await self.two_models()
        samples: list[int] = []
        sampler = LoopingCall(lambda: samples.append(len(live_children())))
        sampler.clock = reactor
        sampler.start(0.005)
        self.addCleanup(lambda: sampler.running and sampler.stop())

        async def client(first: int) -> list[int]:
            codes = []
            for i in range(25):
                code, _ = await self.chat((A, B)[(first + i) % 2])
                codes.append(code)
            return codes

        results = await DeferredList([ensureDeferred(client(n)) for n in range(4)], consumeErrors=True)
        sampler.stop()
        codes = [code for ok, result in results for code in (result if ok else [result])]
        self.assertEqual(codes, [200] * 100)
        self.assertGreater(len(samples), 100)
        self.assertEqual(max(samples), 1, "two runners were alive at once")
