"""Client mistakes the real llama-server answers with a 500 (or worse): mrunner answers 400 first.

Each case was sent to the pinned llama-server directly and came back a 500;
through mrunner each is a 400 naming the field (or saying the JSON is not
standard), no runner restarts, and the same runners then answer good requests.
"""

from __future__ import annotations

import json
from typing import Any

from mrunner.testing.tinymodel import write_tiny_reranker
from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase

HI = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
# (path, body, the param the 400 names; None when the JSON itself is refused)
CASES: list[tuple[str, Any, str | None]] = [
    (CHAT, {"model": TINY, "messages": [{"role": 5, "content": "hi"}]}, "messages[0].role"),
    (
        CHAT,
        b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
        % TINY.encode(),
        None,
    ),
    (
        CHAT,
        {
            "model": TINY,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        },
        "model",  # a model without a projector
    ),
    (
        CHAT,
        {"model": TINY, "messages": [{"role": "user", "content": "hi", "name": None}]},
        "messages[0].name",
    ),
    (
        CHAT,
        {
            "model": TINY,
            "messages": [
                {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
            ],
        },
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        CHAT,
        {
            "model": TINY,
            "messages": HI,
            "tools": [{"type": "function", "function": {"name": "f", "description": 5}}],
        },
        "tools[0].function.description",
    ),
    ("/v1/embeddings", {"model": TINY, "input": "x", "encoding_format": None}, "encoding_format"),
    ("/rerank", {"model": "ai/reranker", "query": "q", "documents": ["a", "b"], "top_n": -1}, "top_n"),
    ("/rerank", {"model": "ai/reranker", "query": "q", "documents": ["a", "b"], "top_n": 2**32 - 1}, "top_n"),
]


class ClientMistakeTests(LlamaCppTestCase):
    async def send(self, path: str, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await http.post(
            self.daemon.url + path, data=data, headers={"content-type": "application/json"}
        )
        return response.code, json.loads(await response.text())

    async def test_mistakes_are_400s_and_the_runners_live(self) -> None:
        await self.start()
        await self.tiny()
        await self.tiny("ai/reranker", write_tiny_reranker)
        # Warm runners first: a mistake must not reach, or kill, a runner that is there.
        for path, body in [
            (CHAT, {"model": TINY, "messages": HI, "max_tokens": 1}),
            ("/rerank", {"model": "ai/reranker", "query": "q", "documents": ["a"]}),
        ]:
            self.assertEqual((await self.send(path, body))[0], 200)
        pids = sorted(runner.pid for runner in self.daemon.scheduler.snapshot())
        for path, body, param in CASES:
            code, answer = await self.send(path, body)
            self.assertEqual(code, 400, (path, body, answer))
            self.assertEqual(answer["error"].get("param"), param, answer)
        self.assertEqual(sorted(runner.pid for runner in self.daemon.scheduler.snapshot()), pids)
        code, answer = await self.send(CHAT, {"model": TINY, "messages": HI, "max_tokens": 2})
        self.assertEqual(code, 200, answer)
