"""The compat APIs' pure parts: error shapes, request/answer translation, the response store."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.compat.ollama import shapes as ollama_shapes
from mrunner.api.compat.responses import shapes as responses_shapes
from mrunner.api.compat.responses.response_store import ResponseStore, StoredResponse, memory
from mrunner.api.door.callers import OPEN, key_caller
from mrunner.api.errors import anthropic_shape, ollama_shape, openai_shape
from mrunner.api.openai.tally import Tally
from mrunner.errors import (
    BadGateway,
    BadRequest,
    MrunnerError,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    Unprocessable,
)


class ErrorShapeTests(SynchronousTestCase):
    def test_anthropic_statuses_and_types(self) -> None:
        cases = [
            (BadRequest("m"), 400, "invalid_request_error"),
            (NotFound("m"), 404, "not_found_error"),
            (PayloadTooLarge("m"), 413, "request_too_large"),
            (Unprocessable("m"), 400, "invalid_request_error"),
            (MrunnerError("m"), 500, "api_error"),
            (BadGateway("m"), 500, "api_error"),
            (Unavailable("m"), 529, "overloaded_error"),
        ]
        for error, status, kind in cases:
            self.assertEqual(
                anthropic_shape(error), (status, {"type": "error", "error": {"type": kind, "message": "m"}})
            )

    def test_ollama_and_openai(self) -> None:
        self.assertEqual(ollama_shape(NotFound("gone")), (404, {"error": "gone"}))
        self.assertEqual(openai_shape(NotFound("gone"))[1]["error"]["type"], "not_found_error")


class OllamaShapeTests(SynchronousTestCase):
    def test_options(self) -> None:
        fields, num_ctx = ollama_shapes.options({"options": {"num_predict": 5, "top_k": 2, "num_ctx": 512}})
        self.assertEqual((fields, num_ctx), ({"max_tokens": 5, "top_k": 2}, 512))
        with self.assertRaisesRegex(BadRequest, "num_thread"):
            ollama_shapes.options({"options": {"num_thread": 2}})
        with self.assertRaisesRegex(BadRequest, "num_ctx"):
            ollama_shapes.options({"options": {"num_ctx": "big"}})

    def test_format_and_think(self) -> None:
        self.assertEqual(ollama_shapes.response_format("json"), {"response_format": {"type": "json_object"}})
        self.assertEqual(ollama_shapes.response_format(""), {})
        with self.assertRaisesRegex(BadRequest, "format"):
            ollama_shapes.response_format("yaml")
        with self.assertRaisesRegex(BadRequest, "high"):
            ollama_shapes.thinking("high")

    def test_images_need_a_projector(self) -> None:
        messages = [{"role": "user", "content": "what is it", "images": ["aGk="]}]
        with self.assertRaisesRegex(BadRequest, "projector"):
            ollama_shapes.chat_messages(messages, False, "m")
        (message,) = ollama_shapes.chat_messages(messages, True, "m")
        self.assertEqual(message["content"][1]["image_url"]["url"], "data:image/png;base64,aGk=")

    def test_tool_calls_back(self) -> None:
        calls = [{"id": "x", "function": {"name": "f", "arguments": '{"a": 1}'}}]
        self.assertEqual(
            ollama_shapes.tool_calls(calls), [{"function": {"name": "f", "arguments": {"a": 1}}}]
        )

    def test_durations_in_nanoseconds(self) -> None:
        timings = {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": 4, "predicted_ms": 2.0}
        self.assertEqual(
            ollama_shapes.durations(timings, 10.0, 10.25, 11.0),
            {
                "total_duration": 1_000_000_000,
                "load_duration": 250_000_000,
                "prompt_eval_duration": 1_500_000,
                "eval_duration": 2_000_000,
            },
        )


class ResponsesShapeTests(SynchronousTestCase):
    def test_items_become_messages(self) -> None:
        items = responses_shapes.input_items(
            [
                {"role": "developer", "content": "rules"},
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "a", "output": "1"},
            ]
        )
        self.assertTrue(all(item["id"] for item in items))
        messages = responses_shapes.chat_messages(items)
        self.assertEqual([m["role"] for m in messages], ["system", "user", "assistant", "tool"])
        self.assertEqual([c["id"] for c in messages[2]["tool_calls"]], ["a", "b"])

    def test_refusals_name_the_feature(self) -> None:
        with self.assertRaisesRegex(BadRequest, "file_search"):
            responses_shapes.chat_tools({"tools": [{"type": "file_search"}]})
        with self.assertRaisesRegex(BadRequest, "computer_call"):
            responses_shapes.chat_messages(responses_shapes.input_items([{"type": "computer_call"}]))
        with self.assertRaisesRegex(BadRequest, "input_file"):
            responses_shapes.chat_messages(
                responses_shapes.input_items([{"role": "user", "content": [{"type": "input_file"}]}])
            )

    def test_fields_llama_server_reads_must_be_text(self) -> None:
        """Issue 22 M6: a number where llama-server reads text was its 500 (or a TypeError's)."""
        for item, param in [
            ({"type": "function_call", "call_id": 7, "name": "f"}, "input[0].call_id"),
            ({"type": "function_call", "name": ["f"]}, "input[0].name"),
            ({"type": "function_call", "name": "f", "arguments": {}}, "input[0].arguments"),
            ({"type": "function_call_output", "call_id": 7, "output": "x"}, "input[0].call_id"),
            ({"role": "user", "content": [{"type": "input_text", "text": 5}]}, "input[0].content[0].text"),
            (
                {"role": "user", "content": [{"type": "input_image", "image_url": 5}]},
                "input[0].content[0].image_url",
            ),
        ]:
            error = self.assertRaises(
                BadRequest, responses_shapes.chat_messages, responses_shapes.input_items([item])
            )
            self.assertEqual(error.param, param)
        error = self.assertRaises(BadRequest, responses_shapes.chat_tools, {"tools": [{"type": "function"}]})
        self.assertEqual(error.param, "tools[0].name")

    def test_streamed_tool_call_pieces(self) -> None:
        tally = Tally()
        for piece in ('{"ci', 'ty": "Paris"}'):
            delta = {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c" if piece.startswith("{") else None,
                        "function": {
                            "name": "weather" if piece.startswith("{") else None,
                            "arguments": piece,
                        },
                    }
                ]
            }
            tally.add({"choices": [{"delta": delta, "finish_reason": None}]})
        tally.add({"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "timings": {"prompt_n": 2}})
        (item,) = responses_shapes.output_items(tally)
        self.assertEqual((item["type"], item["call_id"], item["name"]), ("function_call", "c", "weather"))
        self.assertEqual(item["arguments"], '{"city": "Paris"}')
        self.assertEqual(tally.counts, (2, 0))


class ResponseStoreTests(SynchronousTestCase):
    def stored(self, response_id: str, text: str = "") -> StoredResponse:
        return StoredResponse({"id": response_id}, [{"text": text}], [])

    def test_owned_by_its_key(self) -> None:
        """Issue 22 M7: another key is told the response does not exist; an admin sees it."""
        store = ResponseStore(Clock(), 3600, 10, 10_000)
        k1, k2 = key_caller(b"k1", admin=False), key_caller(b"k2", admin=False)
        store.put(self.stored("a", "k1's prompt"), k1.owner)
        self.assertNotIn("k1", str(k1.owner))
        self.assertRaises(NotFound, store.get, "a", k2)
        self.assertRaises(NotFound, store.delete, "a", k2)
        self.assertRaises(NotFound, store.get, "a", key_caller(None, admin=False))
        self.assertEqual(store.get("a", k1).input_items, [{"text": "k1's prompt"}])
        self.assertEqual(store.get("a", key_caller(b"root", admin=True)).response, {"id": "a"})
        store.delete("a", k1)
        self.assertEqual(len(store), 0)

    def test_bound_counts_memory(self) -> None:
        """Issue 22 M2: many small items took 11-18 times their JSON length as Python objects; kept
        encoded, the store's count of bytes is what the entries hold."""
        stored = StoredResponse({"id": "a"}, [{} for _ in range(100_000)], [])
        store = ResponseStore(Clock(), 3600, 10, 1_000_000)
        store.put(stored)
        self.assertEqual(store.get("a", OPEN), stored)
        self.assertEqual(store.bytes, memory(stored.encode()))
        self.assertLess(store.bytes, 400_000)

    def test_ttl(self) -> None:
        clock = Clock()
        store = ResponseStore(clock, 3600, 10, 10_000)
        store.put(self.stored("a"))
        clock.advance(3599)
        self.assertEqual(store.get("a", OPEN).response, {"id": "a"})
        clock.advance(1)
        self.assertRaises(NotFound, store.get, "a", OPEN)
        self.assertEqual((len(store), store.bytes), (0, 0))

    def test_count_and_bytes_bounds_drop_the_oldest(self) -> None:
        store = ResponseStore(Clock(), 3600, 2, 10_000)
        for name in "abc":
            store.put(self.stored(name))
        self.assertRaises(NotFound, store.get, "a", OPEN)
        self.assertEqual(len(store), 2)
        size = memory(self.stored("x", "y" * 100).encode())
        store = ResponseStore(Clock(), 3600, 100, size * 2)
        for name in "abc":
            store.put(self.stored(name, "y" * 100))
        self.assertEqual((len(store), store.bytes), (2, size * 2))
        store.put(self.stored("big", "y" * size * 3))
        self.assertRaises(NotFound, store.get, "big", OPEN)

    def test_delete(self) -> None:
        store = ResponseStore(Clock(), 3600, 10, 10_000)
        store.put(self.stored("a"))
        store.delete("a", OPEN)
        self.assertRaises(NotFound, store.delete, "a", OPEN)
        self.assertEqual(store.bytes, 0)
