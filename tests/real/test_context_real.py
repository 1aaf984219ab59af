"""A conversation longer than the model's context, and a context_size above the model's: real llama-server.

The tiny model was trained for CONTEXT tokens. Configured with more, llama-server
still gives each request at most CONTEXT, and says so only in its own log:
mrunner names the size in force in ps and _configure's answer. A conversation
past it is a 400 naming the size on every API, through each official client, before a runner
starts as from a loaded one.
"""

from __future__ import annotations

import json

import anthropic
import ollama
import openai

from mrunner.testing.tinymodel import CONTEXT
from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase

CLOSE = {"Connection": "close"}  # leave no connection open after a test
ASKED = 4 * CONTEXT  # tokens the context_size asks for
TOO_LONG = [{"role": "user", "content": "the sea " * CONTEXT}]  # 2 x CONTEXT words, each a token or more
FITS = f"no longer fits in the model's context of {CONTEXT} tokens"


class ContextTests(LlamaCppTestCase):
    async def test_the_context_in_force_and_a_conversation_past_it(self) -> None:
        await self.start(f'[models."{TINY}"]\ncontext_size = {ASKED}\n')
        await self.tiny()

        response = await http.post(
            self.daemon.url + "/engines/_configure", json={"model": TINY, "context_size": ASKED}
        )
        answer = json.loads(await response.text())
        self.assertEqual((response.code, answer["context_size"]), (200, CONTEXT), answer)
        self.assertIn(f"context_size {ASKED} for {TINY} is more than the model will give", answer["warning"])

        # OpenAI's chat, as the official client sees it, streamed or not.
        client = openai.OpenAI(
            base_url=self.daemon.url + "/v1", api_key="unused", max_retries=0, default_headers=CLOSE
        )
        for stream in (False, True):
            with self.assertRaises(openai.BadRequestError) as caught:
                await self.call(
                    client.chat.completions.create, model=TINY, messages=TOO_LONG, max_tokens=4, stream=stream
                )
            self.assertEqual(caught.exception.code, "context_length_exceeded")
            self.assertIn(FITS, caught.exception.message)
            self.assertIn("start a new conversation", caught.exception.message)

        # Refused before any runner started (the count from the vocabulary); a short one loads it.
        self.assertEqual(json.loads(await (await http.get(self.daemon.url + "/engines/ps")).text()), [])
        short = [{"role": "user", "content": "the sea"}]
        await self.call(client.chat.completions.create, model=TINY, messages=short, max_tokens=1)
        (runner,) = json.loads(await (await http.get(self.daemon.url + "/engines/ps")).text())
        self.assertEqual((runner["context_size"], runner["context_size_configured"]), (CONTEXT, ASKED))
        self.assertIn(f"each request gets at most {CONTEXT} tokens", runner["warning"])

        # OpenAI's Responses.
        with self.assertRaises(openai.BadRequestError) as caught:
            await self.call(client.responses.create, model=TINY, input=TOO_LONG, max_output_tokens=4)
        self.assertIn(FITS, caught.exception.message)

        # Anthropic's Messages, in Anthropic's error shape.
        messages = anthropic.Anthropic(
            base_url=self.daemon.url + "/anthropic", api_key="unused", max_retries=0, default_headers=CLOSE
        )
        with self.assertRaises(anthropic.BadRequestError) as caught_anthropic:
            await self.call(messages.messages.create, model=TINY, max_tokens=4, messages=TOO_LONG)
        self.assertEqual(caught_anthropic.exception.body["type"], "error")
        self.assertEqual(caught_anthropic.exception.body["error"]["type"], "invalid_request_error")
        self.assertIn(FITS, caught_anthropic.exception.message)

        # Ollama's chat, in Ollama's.
        local = ollama.Client(host=self.daemon.url, headers=CLOSE)
        with self.assertRaises(ollama.ResponseError) as caught_ollama:
            await self.call(local.chat, model=TINY, messages=TOO_LONG, options={"num_predict": 4})
        self.assertEqual(caught_ollama.exception.status_code, 400)
        self.assertIn(FITS, caught_ollama.exception.error)
