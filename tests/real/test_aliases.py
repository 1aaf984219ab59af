"""Aliases end to end: the official clients of each API name an alias and reach the stored model.

The daemon is real, the runner is the stand-in (tests/support/runner_program.py), which records each
request it is sent: so the test sees that the alias's model was loaded and served.
"""

from __future__ import annotations

from typing import Any

import ollama
from openai import OpenAI
from twisted.internet.threads import deferToThread

from tests.support.daemon import http
from tests.support.daemon_cases import MODEL, CompatDaemonTestCase
from tests.support.ggufs import write_tiny_gguf

ALIASES = f'[aliases]\n"gpt-4o-mini" = "{MODEL}"\n"claude-3-5-haiku" = "{MODEL}"\n'


class AliasTests(CompatDaemonTestCase):
    async def get(self, path: str) -> Any:
        response = await http.get(self.daemon.url + path)
        self.assertEqual(response.code, 200)
        return await response.json()

    async def test_every_api(self) -> None:
        """OpenAI chat and Responses, Anthropic and Ollama: each answers for the alias from MODEL's runner."""
        await self.start(ALIASES)
        self.open_gates(40)
        url = self.daemon.url
        close = {"Connection": "close"}  # no connection left open in the thread's pool
        openai = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, default_headers=close)
        llama = ollama.Client(host=url, headers=close)
        chat = await deferToThread(
            openai.chat.completions.create, model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        self.assertTrue(chat.choices[0].message.content)
        response = await deferToThread(openai.responses.create, model="gpt-4o-mini", input="hi")
        self.assertEqual(response.status, "completed")
        # The stand-in runner streams whatever path it is sent: Anthropic's is asked for a stream.
        body = {"model": "claude-3-5-haiku", "max_tokens": 10, "stream": True, "messages": []}
        code, text = await self.post("/anthropic/v1/messages", body)
        self.assertEqual(code, 200, text)
        answer = await deferToThread(
            llama.chat, model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        self.assertTrue(answer.message.content)
        (runner,) = self.daemon.scheduler.snapshot()
        self.assertEqual(runner.model_name, MODEL, "one runner, the stored model's, served all four")
        self.assertEqual(len(self.sent_to_runner()), 4)

    async def test_listed(self) -> None:
        await self.start(ALIASES)
        models = {m["id"]: m for m in (await self.get("/v1/models"))["data"]}
        self.assertEqual(models["gpt-4o-mini"]["alias_of"], MODEL)
        self.assertNotIn("alias_of", models[MODEL])
        one = await self.get("/v1/models/gpt-4o-mini")
        self.assertEqual((one["id"], one["alias_of"]), ("gpt-4o-mini", MODEL))
        tags = {m["name"]: m for m in (await self.get("/api/tags"))["models"]}
        self.assertEqual(tags["claude-3-5-haiku"]["alias_of"], MODEL)
        self.assertEqual(tags["claude-3-5-haiku"]["digest"], tags[MODEL]["digest"])

    async def test_reload_and_shadow(self) -> None:
        """A reload replaces the aliases; a stored model of an alias's name wins over the alias."""
        await self.start()
        self.open_gates(40)
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        code, _ = await self.post("/v1/chat/completions", body)
        self.assertEqual(code, 404)
        conf = self.daemon.config_path
        conf.write_text(conf.read_text().replace("\n[backends", ALIASES + "\n[backends", 1))
        code, reloaded = await self.post("/engines/_reload", {})
        self.assertEqual((code, reloaded["restart_required"]), (200, []))
        code, answer = await self.post("/v1/chat/completions", body)
        self.assertEqual(code, 200, answer)
        other = self.home / "other.gguf"
        write_tiny_gguf(other, seed=1)
        await self.daemon.import_model("ai/gpt-4o-mini", other)
        code, answer = await self.post("/v1/chat/completions", body)
        self.assertEqual(code, 200, answer)
        self.assertEqual(
            sorted(r.model_name for r in self.daemon.scheduler.snapshot()),
            sorted([MODEL, "ai/gpt-4o-mini:latest"]),
            "the stored model of that name answered, not the alias's",
        )
        self.assertNotIn("gpt-4o-mini", [m["id"] for m in (await self.get("/v1/models"))["data"]])
