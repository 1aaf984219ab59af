"""The guess test, on the real llama-server with the tiny model: without share_cache, key B sending key
A's system prompt as a guess finds no more of it cached than a wrong guess does, on each API
(issue 53 H2: B was given A's slot, and cached_tokens, timings.cache_n and time told the guess)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import ollama

from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase

CLOSE = {"Connection": "close"}
CACHED = "llamacpp_prompt_tokens_cached_total{"
KEYS = '[http]\napi_keys = ["alice-key", "bob-key"]\n[cache]\nmin_tokens = 64\n'
#: About 1,300 of the tiny model's tokens: A's system prompt, which B guesses.
SECRET = "Alpha " + " ".join(f"rule {i}: the vault code is {i * 7919 % 10007}." for i in range(40))
#: A wrong guess, differing from the first word on.
WRONG = "Omega " + SECRET.removeprefix("Alpha ")
#: Ask as a key with a system prompt (or none): the tokens the runner had cached, as a client sees them.
Ask = Callable[[str, "str | None", str], Awaitable[int]]


def messages(system: str | None, user: str) -> list[dict[str, str]]:
    said: list[dict[str, str]] = [] if system is None else [{"role": "system", "content": system}]
    return [*said, {"role": "user", "content": user}]


class GuessTests(LlamaCppTestCase):
    timeout = 300

    async def assertNoTell(self, ask: Ask, placed: bool = True) -> None:
        """B's right guess of A's prompt finds as much cached as a wrong one, and little: B fills a
        slot of its own before each, and A's prompt is cached in A's slot (slot 0) each time. Where
        mrunner places the turns (C{placed}), A's slot is kept for A; else it was erased."""
        await self.start(KEYS, parallel=2)
        await self.tiny()
        cached = []
        for guess in (SECRET, WRONG):
            await ask("alice-key", SECRET, "Hello")
            await ask("bob-key", None, "Something of my own to talk about")
            cached.append(await ask("bob-key", guess, "Hello"))
        right, wrong = cached
        self.assertEqual(right, wrong, "the right guess finds as much cached as the wrong one")
        self.assertLess(right, 50)
        if placed:
            self.assertGreater(await ask("alice-key", SECRET, "Hello"), 400, "A's own cache is kept")

    def openai(self, extra: dict[str, Any] | None = None) -> Ask:
        """Ask through OpenAI's API, B's guesses with C{extra} in their body."""

        async def ask(key: str, system: str | None, user: str) -> int:
            client = self.client.with_options(api_key=key)
            answer = await self.call(
                client.chat.completions.create,
                model=TINY,
                messages=messages(system, user),
                max_tokens=1,
                extra_body=extra if key == "bob-key" and system is not None else None,
            )
            return int(answer.usage.prompt_tokens_details.cached_tokens)

        return ask

    async def test_openai(self) -> None:
        await self.assertNoTell(self.openai())

    async def test_openai_naming_the_slot(self) -> None:
        """B naming A's slot (llama.cpp's id_slot) is placed by mrunner all the same."""
        await self.assertNoTell(self.openai({"id_slot": 0}))

    async def test_anthropic(self) -> None:
        """llama-server places an Anthropic turn itself: the free slots of A's are erased first."""

        async def ask(key: str, system: str | None, user: str) -> int:
            client = anthropic.Anthropic(
                base_url=self.daemon.url + "/anthropic", api_key=key, max_retries=0, default_headers=CLOSE
            )
            extra = {} if system is None else {"system": system}
            answer = await self.call(
                client.messages.create, model=TINY, max_tokens=1, messages=messages(None, user), **extra
            )
            return int(answer.usage.cache_read_input_tokens or 0)

        await self.assertNoTell(ask, placed=False)

    async def test_ollama(self) -> None:
        """Ollama's answer has only times: the cached tokens are the runner's count of them, before
        and after."""

        async def ask(key: str, system: str | None, user: str) -> int:
            headers = {**CLOSE, "Authorization": f"Bearer {key}"}
            client = ollama.Client(host=self.daemon.url, headers=headers)
            options = {"num_predict": 1}
            before = await self.runner_cached_tokens()
            await self.call(client.chat, model=TINY, messages=messages(system, user), options=options)
            return await self.runner_cached_tokens() - before

        await self.assertNoTell(ask)

    async def runner_cached_tokens(self) -> int:
        """The prompt tokens the runner reused from its cache so far (llama-server's own count)."""
        headers: dict[bytes | str, bytes | str] = {"Authorization": "Bearer alice-key"}
        text = await (await http.get(self.daemon.url + "/metrics", headers=headers)).text()
        found = [line.split()[-1] for line in text.splitlines() if line.startswith(CACHED)]
        return int(float(found[0])) if found else 0
