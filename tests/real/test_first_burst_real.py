"""A burst of first requests for a model on a daemon just restarted on its home (issue 53 N1/H1).

A model's first load after a start checks its blobs' digests once, under a lock per digest; the
lock's entry was deleted by whichever holder released it last, and a waiter the release had run
to its end deleted it first: 3 of 4 requests got a 500 KeyError. Here 4, 8 and 16 requests at
once, each on the OpenAI, Anthropic and Ollama routes, each first after a restart: all 200.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import ensureDeferred, gatherResults

from tests.support.daemon import InProcessDaemon, http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase

HI = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "openai": ("/v1/chat/completions", {"model": TINY, "messages": HI, "max_tokens": 2}),
    "anthropic": ("/anthropic/v1/messages", {"model": TINY, "messages": HI, "max_tokens": 2}),
    "ollama": ("/api/chat", {"model": TINY, "messages": HI, "stream": False, "options": {"num_predict": 2}}),
}


class FirstBurstTests(LlamaCppTestCase):
    timeout = 600

    async def restarted(self) -> None:
        """A new daemon on the same home: its models' first loads check their digests again."""
        await self.daemon.stop()
        self.daemon = InProcessDaemon(self.daemon.config_path)
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))

    async def codes(self, path: str, body: dict[str, Any], count: int) -> list[tuple[int, str]]:
        async def one() -> tuple[int, str]:
            response = await http.post(self.daemon.url + path, json=body)
            return response.code, (await response.text())[:200]

        return await gatherResults([ensureDeferred(one()) for _ in range(count)])

    async def test_every_first_request_of_a_burst_is_served(self) -> None:
        await self.start(parallel=4)
        await self.tiny()
        for count in (4, 8, 16):
            for api, (path, body) in ROUTES.items():
                await self.restarted()
                answers = await self.codes(path, body, count)
                self.assertEqual([code for code, _ in answers], [200] * count, f"{api}, {count}: {answers}")
