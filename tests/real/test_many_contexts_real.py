"""Many conversations at once on one model (issue 49): real llama-server, the tiny model trained for
8,192 tokens, C{parallel = 4}.

Each request may use a whole context, so two or four conversations of ~5,000
tokens at once are all served (before, one pool of 8,192 cells for four slots
answered each a 500 "Context size has been exceeded"); with a memory budget that
holds two contexts the runner gets two slots and the others wait; with one, the
four are served one at a time, the others counted as waiting; a prompt past one
context is a 400 naming it, before any runner starts; on the OpenAI, Anthropic
and Ollama routes, streamed and not, each answer read to its end.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
from twisted.internet.defer import Deferred, gatherResults

from mrunner.backends.llamacpp.sizing import memory_estimate
from mrunner.testing.tinymodel import write_tiny_llama
from mrunner.values.backend import RunnerSettings
from mrunner.values.model import Model
from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase, smollm2

CONTEXT = 8192
#: Repetitions of "the water " (ten tokens each in the tiny vocabulary): ~4,900 tokens.
LONG_WORDS = 490
#: Past one context: ~9,000 tokens.
TOO_LONG_WORDS = 900
GENERATED = 100
#: The gauge of the requests waiting for the model's runner, in /metrics.
WAITING = "mrunner_model_queue_waiting{"
SMOLLM2 = "ai/smollm2"
CLOSE = {"Connection": "close"}  # no connection left open after a test

#: Each route: its path, the body for a prompt and a length, and what ends its stream.
ROUTES: dict[str, tuple[str, Any, bytes]] = {
    "openai": (
        "/v1/chat/completions",
        lambda messages, stream: {"messages": messages, "max_tokens": GENERATED, "stream": stream},
        b"data: [DONE]",
    ),
    "anthropic": (
        "/anthropic/v1/messages",
        lambda messages, stream: {"messages": messages, "max_tokens": GENERATED, "stream": stream},
        b"message_stop",
    ),
    "ollama": (
        "/api/chat",
        lambda messages, stream: {
            "messages": messages,
            "options": {"num_predict": GENERATED},
            "stream": stream,
        },
        b'"done":true',
    ),
}


def conversation(n: int, words: int = LONG_WORDS) -> list[dict[str, str]]:
    """A user's long message, a different one for each C{n} (no two share a cached prompt)."""
    return [{"role": "user", "content": f"{n} " + "the water " * words}]


class ManyContextsTests(LlamaCppTestCase):
    timeout = 600

    async def start_model(self, config: str = "") -> None:
        await self.start(config, parallel=4)
        self.gguf = self.home / "tiny.gguf"
        write_tiny_llama(self.gguf, context=CONTEXT)
        await self.daemon.import_model(TINY, self.gguf)

    async def send(self, route: str, messages: list[dict[str, str]], stream: bool) -> tuple[int, bytes]:
        """One request on C{route}, its answer read to its end."""
        path, body, _ = ROUTES[route]
        response = await http.post(self.daemon.url + path, json={"model": TINY, **body(messages, stream)})
        return response.code, await response.content()

    async def at_once(self, count: int, route: str, stream: bool) -> None:
        """C{count} conversations of ~5,000 tokens at once: each a 200, read to its end."""
        sent = [Deferred.fromCoroutine(self.send(route, conversation(n), stream)) for n in range(count)]
        answers = await gatherResults(sent)
        for code, body in answers:
            self.assertEqual(code, 200, (route, stream, count, body[:300]))
            if stream:
                self.assertIn(ROUTES[route][2].replace(b" ", b""), body.replace(b" ", b""), (route, count))
            elif route == "openai":  # ~5,000 tokens each, as the runner counted them
                self.assertLess(abs(json.loads(body)["usage"]["prompt_tokens"] - 4900), 200)

    async def ps(self) -> dict[str, Any]:
        (runner,) = json.loads(await (await http.get(self.daemon.url + "/engines/ps")).text())
        return runner

    async def test_two_and_four_conversations_at_once(self) -> None:
        await self.start_model()
        for route in ROUTES:
            for stream in (False, True):
                for count in (2, 4):
                    await self.at_once(count, route, stream)
        runner = await self.ps()
        self.assertEqual((runner["parallel"], runner["context_size"]), (4, CONTEXT))
        self.assertIsNone(runner["warning"])

    async def test_past_one_context_is_a_400_naming_it(self) -> None:
        """Before any runner starts (counted from the model's vocabulary), and from a loaded one."""
        await self.start_model()
        await self.too_long_everywhere("(at least 9")
        self.assertEqual(json.loads(await (await http.get(self.daemon.url + "/engines/ps")).text()), [])
        await self.at_once(1, "openai", False)
        await self.too_long_everywhere("(9")

    async def too_long_everywhere(self, count: str) -> None:
        """A ~9,000-token prompt on every route, streamed and not: a 400 naming the context and C{count}."""
        for route in ROUTES:
            for stream in (False, True):
                code, body = await self.send(route, conversation(0, TOO_LONG_WORDS), stream)
                self.assertEqual(code, 400, (route, stream, body[:300]))
                for said in (f"context of {CONTEXT} tokens", "context_size", count):
                    self.assertIn(said, body.decode(), (route, stream, body[:400]))

    async def test_a_budget_for_two_contexts_gives_two_slots(self) -> None:
        """The four are all served, two at a time; ps and the warning say why."""
        await self.start_model()
        budget = await self.budget_for(2)
        await self.at_once(4, "openai", False)
        runner = await self.ps()
        self.assertEqual((runner["parallel"], runner["parallel_configured"]), (2, 4))
        self.assertIn(f"gets 2 of the 4 slots asked ({CONTEXT} tokens each)", runner["warning"])
        self.assertLessEqual(runner["memory_estimate"], budget)
        await self.at_once(4, "ollama", True)

    async def test_a_budget_for_one_context_serves_them_one_at_a_time(self) -> None:
        """The four are all served, one at a time, the others counted as waiting while they wait."""
        await self.start_model()
        await self.budget_for(1)
        waiting: list[float] = []
        sent = Deferred.fromCoroutine(self.at_once(4, "anthropic", True))
        while not sent.called:
            metrics = await (await http.get(self.daemon.url + "/metrics")).text()
            waiting += [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(WAITING)]
        await sent
        self.assertEqual(max(waiting), 4, "all four wait while the runner loads")
        self.assertIn(3, waiting, "then one is served and three wait for its slot")
        runner = await self.ps()
        self.assertEqual((runner["parallel"], runner["parallel_configured"]), (1, 4))

    async def budget_for(self, slots: int) -> int:
        """A memory budget, reloaded, over the estimate of C{slots} slots of the model as stored and
        under that of one more."""
        response = await http.get(self.daemon.url + f"/models/{TINY}")
        config = json.loads(await response.text())["config"]
        model = Model(id="sha256:" + "0" * 64, tags=(TINY,), created=0, config=config, gguf=str(self.gguf))
        held, more = (RunnerSettings(context_size=CONTEXT, parallel=n) for n in (slots, slots + 1))
        budget = (memory_estimate(model, held) + memory_estimate(model, more)) // 2
        config_path = self.daemon.config_path
        config_path.write_text(
            config_path.read_text().replace("[scheduler]\n", f"[scheduler]\nmemory_budget = {budget}\n")
        )
        code, answer = await self.post("/engines/_reload", {})
        self.assertEqual(code, 200, answer)
        return budget


class SmolLM2FloorTests(LlamaCppTestCase):
    """SmolLM2's own vocabulary, through the official openai client: the count before a runner starts
    is under llama-server's own, and close to it."""

    timeout = 300

    async def test_too_long_before_and_after_a_load(self) -> None:
        await self.start(parallel=1)
        await self.daemon.import_model(SMOLLM2, smollm2())
        client = openai.OpenAI(
            base_url=self.daemon.url + "/v1", api_key="unused", max_retries=0, default_headers=CLOSE
        )
        # About 9,200 tokens: past SmolLM2's 8,192.
        messages = [{"role": "user", "content": "Tell me about the water. " * 1500}]

        async def refused() -> int:
            with self.assertRaises(openai.BadRequestError) as caught:
                await self.call(
                    client.chat.completions.create, model=SMOLLM2, messages=messages, max_tokens=1
                )
            self.assertEqual(caught.exception.code, "context_length_exceeded")
            self.assertIn("context of 8192 tokens", caught.exception.message)
            return int(re.search(r"\((?:at least )?(\d+) tokens\)", caught.exception.message).group(1))

        floor = await refused()
        self.assertEqual(json.loads(await (await http.get(self.daemon.url + "/engines/ps")).text()), [])
        await self.call(
            client.chat.completions.create,
            model=SMOLLM2,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=1,
        )
        counted = await refused()
        self.assertLessEqual(floor, counted)
        self.assertGreater(floor, 0.95 * counted)
