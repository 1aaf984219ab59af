"""llama.cpp for real, through mrunner: the official openai client → mrunner → llama-server.

These tests start real llama-server processes from the pinned build that
``make test`` puts in the shared cache (``python -m mrunner.backends.llamacpp``).
"""

from __future__ import annotations

import json

from twisted.internet.defer import DeferredList, ensureDeferred

from mrunner.testing.tinymodel import write_tiny_reranker
from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase, smollm2


class TinyModelTests(LlamaCppTestCase):
    async def test_chat_completions_embeddings_models(self) -> None:
        await self.start()
        await self.tiny()
        messages = [{"role": "user", "content": "hello"}]
        chat = await self.call(
            self.client.chat.completions.create, model=TINY, messages=messages, max_tokens=5
        )
        self.assertEqual(chat.model, TINY)
        self.assertEqual(chat.usage.completion_tokens, 5)
        self.assertTrue(chat.choices[0].message.content)

        stream = await self.call(
            lambda: list(
                self.client.chat.completions.create(model=TINY, messages=messages, max_tokens=6, stream=True)
            )
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        self.assertTrue(text)
        self.assertGreater(len(stream), 2, "the answer arrives as several events")

        completion = await self.call(self.client.completions.create, model=TINY, prompt="the", max_tokens=3)
        self.assertEqual(completion.usage.completion_tokens, 3)

        embeddings = await self.call(self.client.embeddings.create, model=TINY, input=["hello", "the model"])
        self.assertEqual([len(e.embedding) for e in embeddings.data], [64, 64])
        self.assertEqual([e.index for e in embeddings.data], [0, 1])

        models = await self.call(self.client.models.list)
        self.assertEqual([m.id for m in models.data], [TINY])
        modes = sorted(runner.mode for runner in self.daemon.scheduler.snapshot())
        self.assertEqual(modes, ["completion", "embedding"])

    async def test_rerank(self) -> None:
        await self.start()
        await self.tiny("ai/reranker", write_tiny_reranker)
        body = {"model": "ai/reranker", "query": "hello", "documents": ["the model", "hot water"]}
        code, answer = await self.post("/engines/rerank", body)
        self.assertEqual(code, 200, answer)
        self.assertEqual(sorted(r["index"] for r in answer["results"]), [0, 1])

    async def test_rerank_needs_a_reranker(self) -> None:
        await self.start()
        await self.tiny()
        code, answer = await self.post("/rerank", {"model": TINY, "query": "q", "documents": ["d"]})
        self.assertEqual(code, 400, answer)
        self.assertIn("rerank", answer["error"]["message"])


class SmolLM2Tests(LlamaCppTestCase):
    async def test_two_plus_two(self) -> None:
        await self.start()
        await self.daemon.import_model("ai/smollm2", smollm2())
        reply = await self.call(
            self.client.chat.completions.create,
            model="ai/smollm2",
            messages=[{"role": "user", "content": "What is 2+2?"}],
            temperature=0,
            max_tokens=32,
        )
        self.assertIn("4", reply.choices[0].message.content)

    async def test_is_not_an_embedding_model(self) -> None:
        """Its GGUF gives no pooling type: embeddings are refused in words, before any runner loads
        (llama-server would answer "Pooling type 'none' is not OAI compatible" from a second runner)."""
        await self.start()
        await self.daemon.import_model("ai/smollm2", smollm2())
        for path, body in [
            ("/v1/embeddings", {"model": "ai/smollm2", "input": "hello"}),
            ("/api/embed", {"model": "ai/smollm2", "input": "hello"}),
            ("/api/embeddings", {"model": "ai/smollm2", "prompt": "hello"}),
        ]:
            code, answer = await self.post(path, body)
            self.assertEqual(code, 400, (path, answer))
            self.assertIn("ai/smollm2:latest is not an embedding model", json.dumps(answer), path)
        self.assertEqual(self.daemon.scheduler.snapshot(), [])


class InstallTests(LlamaCppTestCase):
    async def test_configured_path_that_does_not_exist(self) -> None:
        await self.start('[backends."llama.cpp"]\npath = "/nonexistent/llama-server"\n')
        await self.tiny()
        status = await self.settled_status()
        self.assertIn("/nonexistent/llama-server", status["llama.cpp"])
        code, answer = await self.post(
            "/v1/chat/completions", {"model": TINY, "messages": [{"role": "user", "content": "hi"}]}
        )
        self.assertEqual(code, 503)
        self.assertIn("/nonexistent/llama-server", answer["error"]["message"])

    async def test_second_start_reuses_the_build(self) -> None:
        """Finding the cached build takes a --version run, not a 5-minute compile."""
        for _ in range(2):
            await self.start()
            status = await self.settled_status()
            self.assertTrue(status["llama.cpp"].startswith("Running: llama.cpp"), status)
            await self.daemon.stop()


class ConnectionReuseTests(LlamaCppTestCase):
    async def test_queued_streams_on_one_slot(self) -> None:
        """llama-server closes its connection after a stream; the next request must not fail on it."""
        await self.start(parallel=1)
        await self.tiny()
        body = {
            "model": TINY,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        }

        async def stream() -> tuple[int, bytes]:
            response = await http.post(self.daemon.url + "/v1/chat/completions", json=body)
            return response.code, await response.content()

        results = await DeferredList([ensureDeferred(stream()) for _ in range(8)], consumeErrors=True)
        answers = [result for ok, result in results]
        self.assertEqual([code for code, _ in answers], [200] * 8, answers)
        for _, content in answers:
            self.assertIn(b"data: [DONE]", content)
