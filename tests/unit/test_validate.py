"""Strict JSON and the request shapes, rule by rule; the routes' use of them is in test_api."""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.reading import strict_json, validate
from mrunner.api.reading.bodies import json_object
from mrunner.errors import BadRequest


class ParseTests(SynchronousTestCase):
    def refused(self, body: bytes, words: str) -> BadRequest:
        error = self.assertRaises(BadRequest, strict_json.parse_json, body)
        self.assertIn(words, error.message)
        self.assertEqual(error.status, 400)
        return error

    def test_standard_json_only(self) -> None:
        for body in [b"NaN", b'{"t": Infinity}', b'{"t": -Infinity}', b"[NaN]"]:
            self.refused(body, "not standard JSON")
        self.refused(b'{"t": 1e400}', "out of range")
        self.refused(b'{"t": ', "not valid JSON")
        self.refused(b"\xff", "not UTF-8")

    def test_text_llama_server_cannot_read(self) -> None:
        """Issue 22 M4 and H2: lone surrogates (escaped or raw), UTF-16/32 bodies and integers past
        64 bits are a 400 naming the field (Python's decoder took them all; llama-server 500s)."""
        for body, param in [
            (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
            (b'{"input": ["ok", "a\\udc00b"]}', "input[1]"),
            (b'{"model": "\xed\xa0\x80"}', "model"),
            (b'{"x": {"\\ud800": 1}}', 'x."\\ud800"'),
            (b'{"options": {"num_ctx": ' + str(10**400).encode() + b"}}", "options.num_ctx"),
            (b'{"seed": 18446744073709551616}', "seed"),
            (b'{"seed": [-9223372036854775809]}', "seed[0]"),
            (b'"\\udfff"', "(the body)"),
        ]:
            self.assertEqual(self.refused(body, "cannot be read").param, param, body)
        for encoding in ["utf-16", "utf-16-le", "utf-32", "utf-32-be"]:
            self.refused('{"model": "m"}'.encode(encoding), "JSON")
        for body in [
            '{"x": "\\ud83d\\ude00 \U0001f600"}'.encode(),  # a pair, escaped and raw: one character
            b'{"n": [18446744073709551615, -9223372036854775808, 12345678901234567890123.5]}',
            b'{"x": "\\\\ud800"}',  # an escaped backslash, then text
        ]:
            strict_json.parse_json(body)

    def test_duplicate_keys(self) -> None:
        error = self.refused(
            b'{"model": "a", "messages": [], "model": "b"}', "'model' appears more than once"
        )
        self.assertEqual(error.param, "model")
        self.refused(b'{"x": {"a": 1, "a": 2}}', "'a' appears more than once")

    def test_depth(self) -> None:
        def nested(depth: int) -> bytes:
            return b'{"x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

        self.assertIsInstance(strict_json.parse_json(nested(strict_json.MAX_DEPTH)), dict)
        for depth in [strict_json.MAX_DEPTH + 1, 1000, 100_000]:
            self.refused(nested(depth), "nested more than")

    def test_json_object(self) -> None:
        self.assertEqual(json_object(b'{"a": 1.5, "b": [1, "x"]}'), {"a": 1.5, "b": [1, "x"]})
        self.assertRaises(BadRequest, json_object, b"[]")


class ShapeTests(SynchronousTestCase):
    message = {"role": "user", "content": "hi"}

    def param(self, shape: validate.Shape, payload: dict[str, Any]) -> str | None:
        try:
            shape(payload)
        except BadRequest as e:
            self.assertEqual(e.status, 400)
            return e.param
        return None

    def test_chat(self) -> None:
        base = {"model": "m", "messages": [self.message]}
        for change, param in [
            ({}, None),
            ({"messages": [{"role": "assistant", "content": None, "tool_calls": []}]}, None),
            ({"messages": [{**self.message, "content": [{"type": "text", "text": "a"}]}]}, None),
            ({"temperature": 0, "top_p": 1, "max_tokens": 0, "stop": ["a"], "stream": False}, None),
            ({"llama_extension": {"anything": [1, 2]}, "top_k": 40}, None),
            ({"temperature": None, "stop": None}, None),
            ({"messages": None}, "messages"),
            ({"messages": {}}, "messages"),
            ({"messages": [{"content": "hi"}]}, "messages[0].role"),
            ({"messages": [{"role": "boss", "content": "hi"}]}, "messages[0].role"),
            (
                {"messages": [self.message, {"role": "user", "content": [{"text": "a"}]}]},
                "messages[1].content[0].type",
            ),
            (
                {"messages": [{**self.message, "content": [{"type": "text", "text": 5}]}]},
                "messages[0].content[0].text",
            ),
            ({"temperature": -0.1}, "temperature"),
            ({"temperature": True}, "temperature"),
            ({"top_p": "1"}, "top_p"),
            ({"n": 0}, "n"),
            ({"stop": 5}, "stop"),
            ({"stream": 1}, "stream"),
            ({"logit_bias": {"5": "x"}}, "logit_bias"),
            ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
            # llama-server's chat parser answers each of these with a 500
            ({"messages": [{"role": "user"}]}, "messages[0].content"),
            (
                {"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]},
                "messages[0].tool_calls[0].function",
            ),
            (
                {
                    "messages": [
                        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
                    ]
                },
                "messages[0].tool_calls[0].function.arguments",
            ),
            ({"messages": [{**self.message, "reasoning_content": 5}]}, "messages[0].reasoning_content"),
            (
                {"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]},
                "tools[0].function.description",
            ),
            ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
            ({"messages": [{**self.message, "name": None}]}, "messages[0].name"),
            (
                {"tools": [{"type": "function", "function": {"name": "f", "description": None}}]},
                "tools[0].function.description",
            ),
            ({"messages": [{"role": "user", "content": None}]}, None),
        ]:
            self.assertEqual(self.param(validate.chat, {**base, **change}), param, change)

    def test_completions_embeddings_rerank(self) -> None:
        for shape, payload, param in [
            (validate.completions, {"model": "m", "prompt": "the"}, None),
            (validate.completions, {"model": "m", "prompt": [1, 2, 3]}, None),
            (validate.completions, {"model": "m", "prompt": [[1, 2], "x"]}, None),
            (validate.completions, {"model": "m", "prompt": []}, "prompt"),
            (validate.completions, {"model": "m", "prompt": [-1]}, "prompt[0]"),
            (validate.completions, {"model": "m", "prompt": "x", "echo": "yes"}, "echo"),
            (validate.completions, {"model": "m"}, "prompt"),
            (validate.embeddings, {"model": "m", "input": "x", "encoding_format": None}, "encoding_format"),
            (validate.embeddings, {"model": "m", "input": ["a", "b"]}, None),
            (validate.embeddings, {"model": "m", "input": {"a": 1}}, "input"),
            (validate.embeddings, {"model": "m", "input": [[1], [True]]}, "input[1][0]"),
            (validate.embeddings, {"model": "m", "input": "x", "encoding_format": "hex"}, "encoding_format"),
            (validate.rerank, {"model": "m", "query": "q", "documents": ["a"], "top_n": 1}, None),
            (validate.rerank, {"model": "m", "query": 5, "documents": ["a"]}, "query"),
            (validate.rerank, {"model": "m", "query": "q", "documents": []}, "documents"),
            (validate.rerank, {"model": "m", "query": "q", "documents": [{"text": "a"}]}, "documents[0]"),
            (validate.rerank, {"model": "m", "query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ]:
            self.assertEqual(self.param(shape, payload), param, payload)

    def test_messages_name_the_field(self) -> None:
        error = self.assertRaises(BadRequest, validate.chat, {"model": "m", "messages": [{"role": 5}]})
        self.assertEqual(
            error.message,
            """'messages[0].role' must be one of "system", "developer", "user", "assistant", "tool","""
            """ "function", not 5""",
        )

    def test_schemas_say_what_the_rules_check(self) -> None:
        self.assertEqual(validate.integer(0, 20).schema, {"type": "integer", "minimum": 0, "maximum": 20})
        schema = validate.rerank.schema
        self.assertEqual(schema["required"], ["model", "query", "documents"])
        self.assertEqual(
            schema["properties"]["top_n"]["anyOf"][1], {"type": "null"}, "optional fields may be null"
        )
