"""Issue 36's N3 with real processes: a model with two names is answered by the name the request asked.

The model is imported as C{localhost:5000/ai/smollm2} and then also named
C{ai/smollm2}. A chat for either name is served by one runner and answered with
that name (the scripted runner, tests/support/runner_program.py, answers with its
C{--alias} as llama-server does; then llama-server itself with the official
clients). Where no request is in view (C{/engines/ps}, C{/api/ps}, an alias's
C{alias_of}) the model's name is C{ai/smollm2:latest}, as records and usage say.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.daemon import http
from tests.support.daemon_cases import CompatDaemonTestCase
from tests.support.ggufs import write_tiny_gguf
from tests.support.llamacpp_cases import LlamaCppTestCase

LOCAL, SHORT = "localhost:5000/ai/smollm2:latest", "ai/smollm2:latest"
HI = [{"role": "user", "content": "hi"}]


async def two_names(daemon: Any, gguf: Any) -> None:
    """Import C{gguf} as L{LOCAL}, then name it L{SHORT} too: L{LOCAL} is its first tag."""
    await daemon.import_model(LOCAL, gguf)
    response = await http.post(
        f"{daemon.url}/models/{LOCAL}/tag", params={"repo": "ai/smollm2", "tag": "latest"}
    )
    assert response.code == 201, await response.text()


class AnswerNameTests(CompatDaemonTestCase):
    async def get(self, path: str) -> Any:
        response = await http.get(self.daemon.url + path)
        return json.loads(await response.text())

    async def test_the_name_asked(self) -> None:
        await self.start('[aliases]\n"gpt-x" = "localhost:5000/ai/smollm2"\n')
        gguf = self.home / "smol.gguf"
        write_tiny_gguf(gguf, seed=3)
        await two_names(self.daemon, gguf)
        self.open_gates()  # the scripted runner's streams go on at once

        for asked, told in (("ai/smollm2", SHORT), ("smollm2", SHORT), (LOCAL, LOCAL)):
            code, answer = await self.post("/v1/chat/completions", {"model": asked, "messages": HI})
            self.assertEqual((code, answer["model"]), (200, told), asked)
            response = await http.post(
                self.daemon.url + "/v1/chat/completions",
                json={"model": asked, "messages": HI, "stream": True},
            )
            text = await response.text()
            events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            self.assertEqual({event["model"] for event in events}, {told}, asked)
            code, loaded = await self.post(
                "/v1/chat/completions", {"model": asked, "messages": HI}, headers={"X-Preload-Only": "true"}
            )
            self.assertEqual(loaded["model"], told)
        starts = (self.home / "starts").read_text().splitlines()
        self.assertEqual(len(starts), 1, "one runner serves both names")

        ps = await self.get("/engines/ps")
        self.assertEqual([runner["model_name"] for runner in ps], [SHORT])
        self.assertEqual([model["name"] for model in (await self.get("/api/ps"))["models"]], [SHORT])
        listed = {entry["id"]: entry for entry in (await self.get("/v1/models"))["data"]}
        self.assertEqual(listed["gpt-x"]["alias_of"], SHORT)
        records = await self.get("/engines/requests")
        self.assertEqual({record["model"] for record in records}, {SHORT, LOCAL})


class LlamaServerAnswerNameTests(LlamaCppTestCase):
    async def test_the_official_clients_are_told_the_name_asked(self) -> None:
        """llama-server names every answer by its --alias: mrunner tells each client the name it asked."""
        await self.start()
        gguf = self.home / "tiny.gguf"
        write_tiny_llama(gguf)
        await two_names(self.daemon, gguf)
        for asked in (SHORT, LOCAL):
            create = self.client.chat.completions.create
            chat = await self.call(create, model=asked, messages=HI, max_tokens=3)
            self.assertEqual(chat.model, asked)
            stream = await self.call(
                lambda asked=asked: list(
                    self.client.chat.completions.create(model=asked, messages=HI, max_tokens=3, stream=True)
                )
            )
            self.assertEqual({chunk.model for chunk in stream}, {asked})
            claude = anthropic.Anthropic(
                base_url=self.daemon.url + "/anthropic",
                api_key="unused",
                max_retries=0,
                default_headers={"Connection": "close"},
            )
            message = await self.call(claude.messages.create, model=asked, max_tokens=3, messages=HI)
            self.assertEqual(message.model, asked)
