"""The official anthropic, openai (Responses) and ollama clients → mrunner → llama-server with SmolLM2.

One daemon per API, each test walking that API's list; disconnects and runner
death are checked with the stand-in runner in test_compat_daemon.
"""

from __future__ import annotations

import anthropic
import ollama
import openai

from tests.daemon import eventually
from tests.test_llamacpp_e2e import LlamaCppTestCase, smollm2

SMOLLM2 = "ai/smollm2"
QUESTION = "What is 2+2?"
CLOSE = {"Connection": "close"}  # leave no connection open after a test


class AnthropicTests(LlamaCppTestCase):
    async def test_messages(self) -> None:
        await self.start()
        await self.daemon.import_model(SMOLLM2, smollm2())
        for base in ("/anthropic", ""):
            client = anthropic.Anthropic(
                base_url=self.daemon.url + base, api_key="unused", max_retries=0, default_headers=CLOSE
            )
            message = await self.call(
                client.messages.create,
                model=SMOLLM2,
                max_tokens=32,
                temperature=0,
                messages=[{"role": "user", "content": QUESTION}],
            )
            self.assertEqual(message.type, "message")
            self.assertIn("4", message.content[0].text)
            self.assertGreater(message.usage.output_tokens, 0)

        def stream() -> tuple[list[str], str]:
            with client.messages.stream(
                model=SMOLLM2, max_tokens=16, messages=[{"role": "user", "content": "Say hello."}]
            ) as events:
                kinds = [event.type for event in events]
                return kinds, events.get_final_message().content[0].text

        kinds, text = await self.call(stream)
        self.assertTrue(text)
        self.assertEqual(kinds[0], "message_start")
        self.assertEqual(kinds[-1], "message_stop")
        self.assertLess(kinds.index("content_block_start"), kinds.index("content_block_delta"))
        self.assertLess(kinds.index("content_block_stop"), kinds.index("message_delta"))

        asked = [{"role": "user", "content": QUESTION}]
        plain = await self.call(client.messages.count_tokens, model=SMOLLM2, messages=asked)
        with_system = await self.call(
            client.messages.count_tokens, model=SMOLLM2, messages=asked, system="You are a calculator."
        )
        self.assertGreater(plain.input_tokens, 0)
        self.assertGreater(with_system.input_tokens, plain.input_tokens)
        answer = await self.call(
            client.messages.create,
            model=SMOLLM2,
            max_tokens=32,
            temperature=0,
            system="You are a calculator. Answer with a number.",
            messages=asked,
        )
        self.assertIn("4", answer.content[0].text)

        with self.assertRaises(anthropic.NotFoundError) as caught:
            await self.call(client.messages.create, model="ai/absent", max_tokens=5, messages=asked)
        self.assertEqual(caught.exception.body["type"], "error")
        self.assertIn("ai/absent", caught.exception.message)


class ResponsesTests(LlamaCppTestCase):
    async def test_responses(self) -> None:
        await self.start()
        await self.daemon.import_model(SMOLLM2, smollm2())
        client = openai.OpenAI(
            base_url=self.daemon.url + "/v1", api_key="unused", max_retries=0, default_headers=CLOSE
        )
        first = await self.call(
            client.responses.create, model=SMOLLM2, input=QUESTION, temperature=0, max_output_tokens=32
        )
        self.assertEqual(first.status, "completed")
        self.assertIn("4", first.output_text)

        def stream() -> list[object]:
            return list(
                client.responses.create(model=SMOLLM2, input="Say hello.", max_output_tokens=16, stream=True)
            )

        events = await self.call(stream)
        kinds = [event.type for event in events]
        self.assertEqual(kinds[:2], ["response.created", "response.in_progress"])
        self.assertIn("response.output_text.delta", kinds)
        self.assertIn(kinds[-1], ("response.completed", "response.incomplete"))
        self.assertEqual([event.sequence_number for event in events], list(range(len(events))))
        deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
        self.assertEqual(deltas, events[-1].response.output_text)

        named = await self.call(
            client.responses.create,
            model=SMOLLM2,
            input="My name is Alice.",
            temperature=0,
            max_output_tokens=24,
        )
        second = await self.call(
            client.responses.create,
            model=SMOLLM2,
            input="What is my name?",
            previous_response_id=named.id,
            temperature=0,
            max_output_tokens=24,
        )
        self.assertIn("Alice", second.output_text)
        self.assertEqual(second.previous_response_id, named.id)

        again = await self.call(client.responses.retrieve, first.id)
        self.assertEqual((again.id, again.output_text), (first.id, first.output_text))
        items = await self.call(lambda: list(client.responses.input_items.list(second.id)))
        self.assertEqual(items[0].content[0].text, "What is my name?")
        await self.call(client.responses.delete, first.id)
        with self.assertRaises(openai.NotFoundError):
            await self.call(client.responses.retrieve, first.id)

        tools = [
            {
                "type": "function",
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            }
        ]
        asked = await self.call(
            client.responses.create,
            model=SMOLLM2,
            input="What is the weather in Paris?",
            tools=tools,
            tool_choice="required",
            temperature=0,
        )
        (call,) = [item for item in asked.output if item.type == "function_call"]
        self.assertEqual(call.name, "get_weather")
        answered = await self.call(
            client.responses.create,
            model=SMOLLM2,
            previous_response_id=asked.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 degrees"}],
            tools=tools,
            temperature=0,
            max_output_tokens=32,
        )
        self.assertEqual(answered.status, "completed")
        self.assertTrue(answered.output_text)
        self.assertGreater(answered.usage.input_tokens, asked.usage.input_tokens)


class OllamaTests(LlamaCppTestCase):
    def client(self) -> ollama.Client:
        return ollama.Client(host=self.daemon.url, headers=CLOSE)

    async def loaded(self) -> list[str]:
        return [model.model for model in (await self.call(self.client().ps)).models]

    async def test_generation(self) -> None:
        await self.start()
        await self.daemon.import_model(SMOLLM2, smollm2())
        client = self.client()
        question = [{"role": "user", "content": QUESTION}]
        reply = await self.call(client.chat, model="smollm2", messages=question, options={"temperature": 0})
        self.assertIn("4", reply.message.content)
        self.assertTrue(reply.done)
        self.assertEqual(reply.done_reason, "stop")
        self.assertGreater(reply.eval_count, 0)
        self.assertGreater(reply.prompt_eval_count, 0)
        self.assertGreater(reply.total_duration, reply.eval_duration)
        self.assertEqual(await self.loaded(), ["ai/smollm2:latest"])

        parts = await self.call(
            lambda: list(
                client.chat(
                    model="smollm2:latest", messages=question, stream=True, options={"temperature": 0}
                )
            )
        )
        self.assertIn("4", "".join(part.message.content for part in parts))
        self.assertEqual([part.done for part in parts], [False] * (len(parts) - 1) + [True])
        self.assertGreater(parts[-1].eval_count, 0)

        generated = await self.call(
            client.generate, model="smollm2", prompt=QUESTION, options={"temperature": 0, "num_predict": 32}
        )
        self.assertIn("4", generated.response)
        chunks = await self.call(
            lambda: list(
                client.generate(model="smollm2", prompt="Say hello.", stream=True, options={"num_predict": 4})
            )
        )
        self.assertTrue(chunks[-1].done)
        self.assertEqual(chunks[-1].done_reason, "length")
        self.assertEqual(chunks[-1].eval_count, 4)

        embedded = await self.call(client.embed, model="smollm2", input=["hello", "the model"])
        self.assertEqual(len(embedded.embeddings), 2)
        self.assertGreater(len(embedded.embeddings[0]), 100)
        legacy = await self.call(client.embeddings, model="smollm2", prompt="hello")
        self.assertEqual(len(legacy.embedding), len(embedded.embeddings[0]))

        shown = await self.call(client.show, "smollm2")
        self.assertEqual(shown.details.family, "llama")
        self.assertIn("completion", shown.capabilities)

        # keep_alive=0 (sent as 0.0) unloads after the answer; an empty chat loads, and unloads with 0.
        await self.call(
            client.chat, model="smollm2", messages=question, keep_alive=0, options={"num_predict": 2}
        )
        await eventually(lambda: "completion" not in [r["mode"] for r in self.daemon.scheduler.running()], 10)
        self.assertNotIn("completion", [runner["mode"] for runner in self.daemon.scheduler.running()])
        preloaded = await self.call(client.chat, model="smollm2", messages=[])
        self.assertEqual(preloaded.done_reason, "load")
        self.assertIn("completion", [runner["mode"] for runner in self.daemon.scheduler.running()])
        unloaded = await self.call(client.chat, model="smollm2", messages=[], keep_alive=0)
        self.assertEqual(unloaded.done_reason, "unload")
        await eventually(lambda: not self.daemon.scheduler.running(), 10)
        self.assertEqual(self.daemon.scheduler.running(), [])
