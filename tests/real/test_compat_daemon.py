"""Anthropic, Responses and Ollama routes with real processes: mrunner → tests/support/runner_program.py.

The stand-in runner makes streams that wait on gate files, record whether the
client stayed ("finished") or went away ("cancelled"), and can crash mid-way,
so cancellation and runner death are checked deterministically for each API.
The real clients against llama-server are in test_compat_real.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import ollama
from openai import OpenAI
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread

from tests.support.daemon import eventually, http, lines
from tests.support.daemon_cases import MODEL, CompatDaemonTestCase
from tests.support.registry_server import SKIP, RealRegistry

STREAMS = {
    "anthropic": ("/anthropic/v1/messages", {"max_tokens": 10}, b"tok0"),
    "responses": ("/v1/responses", {"input": "hi"}, b"response.output_text.delta"),
    "ollama": ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, b"tok0"),
}


class DisconnectTests(CompatDaemonTestCase):
    """A client that goes away mid-stream aborts the runner request and frees the slot, on every API."""

    async def check_disconnect(self, api: str) -> None:
        await self.start()
        path, body, marker = STREAMS[api]
        Path(f"{self.gate}0").touch()
        events = await self.open_stream(path, {"model": MODEL, "stream": True, **body})
        await events.arrived(marker)
        (runner,) = self.daemon.scheduler.snapshot()
        self.assertEqual(runner.in_use, 1)
        events.transport.stopProducing()
        await eventually(lambda: lines(self.home / "events") == ["cancelled"], 10)
        self.assertEqual(lines(self.home / "events"), ["cancelled"])
        await eventually(lambda: [r.in_use for r in self.daemon.scheduler.snapshot()] == [0])
        self.assertEqual([r.in_use for r in self.daemon.scheduler.snapshot()], [0])

    async def test_anthropic(self) -> None:
        await self.check_disconnect("anthropic")

    async def test_responses(self) -> None:
        await self.check_disconnect("responses")

    async def test_ollama(self) -> None:
        await self.check_disconnect("ollama")


class RunnerDiesTests(CompatDaemonTestCase):
    """A runner that dies mid-stream ends each API's stream with that API's error."""

    async def crash_mid_stream(self, path: str, body: dict[str, Any]) -> bytes:
        await self.start()
        self.open_gates(1)
        events = await self.open_stream(path, {"model": MODEL, "stream": True, **body})
        Path(f"{self.gate}1").touch()
        await events.arrived(STREAMS_MARKERS[path])
        (runner,) = self.daemon.scheduler.snapshot()
        os.kill(runner.pid, signal.SIGKILL)
        await events.done
        return events.data

    async def test_responses_failed_event(self) -> None:
        data = await self.crash_mid_stream("/v1/responses", {"input": "hi"})
        self.assertIn(b"event: response.failed", data)
        self.assertNotIn(b"response.completed", data)

    async def test_ollama_error_line(self) -> None:
        data = await self.crash_mid_stream("/api/chat", {"messages": [{"role": "user", "content": "hi"}]})
        last = json.loads(data.strip().splitlines()[-1])
        self.assertIn("runner", last["error"])

    async def test_anthropic_error_event(self) -> None:
        data = await self.crash_mid_stream("/v1/messages", {"max_tokens": 5})
        self.assertIn(b"event: error", data)
        error = json.loads(data.strip().split(b"data: ")[-1])
        self.assertEqual((error["type"], error["error"]["type"]), ("error", "api_error"))


STREAMS_MARKERS = {
    "/v1/responses": b"response.output_text.delta",
    "/api/chat": b"tok0",
    "/v1/messages": b"tok0",
}


class ErrorShapeTests(CompatDaemonTestCase):
    """mrunner's own errors, in each API's shape and status."""

    async def test_anthropic_errors(self) -> None:
        await self.start("max_request_bytes = 2000")
        cases = [
            ({"model": "ai/none", "messages": []}, 404, "not_found_error"),
            ({"messages": []}, 400, "invalid_request_error"),
            (b"{not json", 400, "invalid_request_error"),
            ({"model": MODEL, "pad": "x" * 3000}, 413, "request_too_large"),
        ]
        for body, status, kind in cases:
            for prefix in ("/anthropic", "", "/engines", "/engines/test"):
                code, answer = await self.post(prefix + "/v1/messages", body, {"x-api-key": "k"})
                self.assertEqual((code, answer["type"], answer["error"]["type"]), (status, "error", kind))
        code, answer = await self.post("/engines/nope/v1/messages", {"model": MODEL})
        self.assertEqual((code, answer["error"]["type"]), (404, "not_found_error"))
        code, answer = await self.post("/anthropic/v1/messages/batches", {})
        self.assertEqual((code, answer["type"]), (404, "error"))
        self.assertIn("batches", answer["error"]["message"])
        response = await http.get(self.daemon.url + "/anthropic/v1/messages")
        self.assertEqual((response.code, json.loads(await response.text())["type"]), (405, "error"))

    async def test_ollama_errors(self) -> None:
        await self.start()
        for path in ("/api/chat", "/api/generate", "/api/embed", "/api/show"):
            code, answer = await self.post(path, {"model": "nothere"})
            self.assertEqual(code, 404, answer)
            self.assertIn("nothere", answer["error"])
        code, answer = await self.post("/api/chat", {"model": MODEL, "options": {"num_gpu": 1}})
        self.assertEqual(code, 400)
        self.assertIn("num_gpu", answer["error"])
        code, answer = await self.post("/api/generate", {"model": MODEL, "prompt": "x", "suffix": "y"})
        self.assertEqual(code, 400)
        self.assertIn("suffix", answer["error"])
        code, answer = await self.post(
            "/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}
        )
        self.assertEqual(code, 400)
        self.assertIn("projector", answer["error"])
        code, answer = await self.post("/api/create", {"model": "x"})
        self.assertEqual(code, 404)
        self.assertIn("/api/create", answer["error"])
        response = await http.get(self.daemon.url + "/api/chat")
        self.assertEqual((response.code, list(json.loads(await response.text()))), (405, ["error"]))

    async def test_every_apis_failures_are_recorded(self) -> None:
        """Ollama's refusals are in /engines/requests as OpenAI's and Anthropic's are."""
        await self.start()
        missing = {"model": "ai/nothere", "messages": [{"role": "user", "content": "x"}]}
        asked = [
            ("/v1/chat/completions", missing, 404),
            ("/v1/messages", {**missing, "max_tokens": 5}, 404),
            ("/api/chat", missing, 404),
            ("/api/generate", {"model": "ai/nothere", "prompt": "x"}, 404),
            ("/api/embed", {"model": "ai/nothere", "input": "x"}, 404),
            ("/api/chat", {"model": MODEL, "options": {"num_gpu": 1}}, 400),
        ]
        for path, body, status in asked:
            code, answer = await self.post(path, body)
            self.assertEqual(code, status, (path, answer))
        records = json.loads(await (await http.get(self.daemon.url + "/engines/requests")).text())
        self.assertEqual(
            sorted((r["route"], r["status"]) for r in records), sorted((p, s) for p, _, s in asked)
        )

    async def test_responses_errors(self) -> None:
        await self.start()
        code, answer = await self.post(
            "/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "r"}
        )
        self.assertEqual(code, 404)
        self.assertEqual(answer["error"]["code"], "response_not_found")
        code, answer = await self.post(
            "/v1/responses", {"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}
        )
        self.assertEqual(code, 400)
        self.assertIn("web_search", answer["error"]["message"])
        code, answer = await self.post("/v1/responses", {"model": MODEL, "input": "x", "background": True})
        self.assertEqual(code, 400)
        self.assertIn("background", answer["error"]["message"])
        for field, value in [
            ("tools", "x"),
            ("text", "x"),
            ("instructions", 3),
            ("input", 3),
            ("tools", [1]),
        ]:
            code, answer = await self.post("/v1/responses", {"model": MODEL, "input": "x", field: value})
            self.assertEqual(code, 400, (field, answer))

    async def test_ollama_malformed_fields_are_400(self) -> None:
        await self.start()
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        for path, body in [
            ("/api/chat", {**chat, "tools": "x"}),
            ("/api/chat", {**chat, "messages": "x"}),
            ("/api/chat", {**chat, "messages": [{"role": "assistant", "tool_calls": [1]}]}),
            ("/api/chat", {**chat, "options": []}),
            ("/api/generate", {"model": MODEL, "prompt": 3}),
            ("/api/embed", {"model": MODEL, "input": [1]}),
            ("/api/chat", {**chat, "keep_alive": "soon"}),
        ]:
            code, answer = await self.post(path, body)
            self.assertEqual(code, 400, (body, answer))
            self.assertEqual(list(answer), ["error"])


class TranslationTests(CompatDaemonTestCase):
    """What the runner is sent for Ollama's and the Responses API's fields."""

    async def test_ollama_options_format_think_tools(self) -> None:
        await self.start()
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        body = {
            "model": "tiny",
            "stream": False,
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
                },
                {"role": "tool", "content": "42"},
            ],
            "tools": tools,
            "format": {"type": "object"},
            "think": False,
            "options": {"temperature": 0.5, "num_predict": 7, "stop": ["x"], "seed": 3},
        }
        code, answer = await self.post("/api/chat", body)
        self.assertEqual(code, 200, answer)
        self.assertEqual(answer["message"], {"role": "assistant", "content": "echo: 42"})
        self.assertTrue(answer["done"])
        self.assertEqual(answer["done_reason"], "stop")
        for key in ("total_duration", "load_duration", "prompt_eval_count", "eval_count", "eval_duration"):
            self.assertIsInstance(answer[key], int)
        (sent,) = self.sent_to_runner()
        self.assertEqual(
            (sent["temperature"], sent["max_tokens"], sent["stop"], sent["seed"]), (0.5, 7, ["x"], 3)
        )
        self.assertEqual(sent["response_format"]["json_schema"]["schema"], {"type": "object"})
        self.assertEqual(sent["chat_template_kwargs"], {"enable_thinking": False})
        self.assertEqual(sent["tools"], tools)
        call = sent["messages"][1]["tool_calls"][0]
        self.assertEqual(
            (call["function"]["arguments"], sent["messages"][2]["tool_call_id"]), ('{"a": 1}', call["id"])
        )

    async def test_ollama_stream_ends_done(self) -> None:
        await self.start()
        self.open_gates()
        response = await http.post(
            self.daemon.url + "/api/generate", json={"model": MODEL, "prompt": "hi", "system": "be brief"}
        )
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"application/x-ndjson"])
        answer = [json.loads(line) for line in (await response.text()).splitlines()]
        self.assertEqual("".join(line["response"] for line in answer), "tok0 tok1 tok2 ")
        self.assertEqual([line["done"] for line in answer], [False] * 3 + [True])
        self.assertEqual(answer[-1]["done_reason"], "stop")
        (sent,) = self.sent_to_runner()
        self.assertEqual([m["role"] for m in sent["messages"]], ["system", "user"])
        metrics = await (await http.get(self.daemon.url + "/metrics")).text()
        self.assertIn('mrunner_requests_total{mode="completion",status="200"} 1.0', metrics)
        (record,) = json.loads(await (await http.get(self.daemon.url + "/engines/requests")).text())
        self.assertEqual((record["route"], record["status"]), ("/api/generate", 200))
        self.assertEqual(record["answer"]["text"], "tok0 tok1 tok2 ")

    async def test_ollama_num_ctx_configures(self) -> None:
        await self.start()
        code, answer = await self.post(
            "/api/chat", {"model": MODEL, "messages": [], "options": {"num_ctx": 1024}}
        )
        self.assertEqual((code, answer["done_reason"]), (200, "load"))
        response = await http.get(self.daemon.url + "/engines/_configure", params={"model": MODEL})
        self.assertEqual(json.loads(await response.text())["context_size"], 1024)

    async def test_responses_chain_and_tool_round_trip(self) -> None:
        await self.start()
        code, first = await self.post(
            "/v1/responses", {"model": MODEL, "input": "one", "instructions": "sys"}
        )
        self.assertEqual((code, first["output"][0]["content"][0]["text"]), (200, "echo: one"))
        call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
        output = {"type": "function_call_output", "call_id": "c1", "output": "two"}
        code, second = await self.post(
            "/engines/v1/responses",
            {"model": MODEL, "input": [call, output], "previous_response_id": first["id"]},
        )
        self.assertEqual(code, 200, second)
        sent = self.sent_to_runner()
        self.assertEqual(
            sent[0]["messages"], [{"role": "system", "content": "sys"}, {"role": "user", "content": "one"}]
        )
        self.assertEqual([m["role"] for m in sent[1]["messages"]], ["user", "assistant", "assistant", "tool"])
        self.assertEqual(sent[1]["messages"][3]["tool_call_id"], "c1")
        code, items = await self.post_get(f"/v1/responses/{second['id']}/input_items?order=asc")
        self.assertEqual([item["type"] for item in items["data"]], ["function_call", "function_call_output"])

    async def test_openai_stream_helper_accumulates(self) -> None:
        """The openai client's own event accumulator accepts the event sequence."""
        await self.start()
        self.open_gates()
        client = OpenAI(
            base_url=self.daemon.url + "/v1",
            api_key="none",
            max_retries=0,
            default_headers={"Connection": "close"},
        )

        def stream() -> tuple[str, str]:
            with client.responses.stream(model=MODEL, input="hi") as events:
                for _ in events:
                    pass
                final = events.get_final_response()
            return final.output_text, final.status

        self.assertEqual(await deferToThread(stream), ("tok0 tok1 tok2 ", "completed"))

    async def test_function_tool_round_trip_with_the_openai_client(self) -> None:
        await self.start()
        client = OpenAI(
            base_url=self.daemon.url + "/engines/v1",
            api_key="none",
            max_retries=0,
            default_headers={"Connection": "close"},
        )
        tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
        asked = await deferToThread(
            client.responses.create, model=MODEL, input="weather?", tools=tools, tool_choice="required"
        )
        (call,) = asked.output
        self.assertEqual(
            (call.type, call.name, call.arguments), ("function_call", "get_weather", '{"city": "Paris"}')
        )
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        answered = await deferToThread(
            client.responses.create, model=MODEL, input=[output], previous_response_id=asked.id, tools=tools
        )
        self.assertEqual(answered.output_text, "echo: sunny")
        sent = self.sent_to_runner()[-1]["messages"]
        self.assertEqual([m["role"] for m in sent], ["user", "assistant", "tool"])
        self.assertEqual(sent[1]["tool_calls"][0]["id"], sent[2]["tool_call_id"])

    async def test_store_false_leaves_nothing(self) -> None:
        await self.start()
        code, answer = await self.post("/v1/responses", {"model": MODEL, "input": "x", "store": False})
        self.assertEqual(code, 200)
        code, _ = await self.post_get(f"/v1/responses/{answer['id']}")
        self.assertEqual(code, 404)

    async def post_get(self, path: str) -> tuple[int, Any]:
        response = await http.get(self.daemon.url + path)
        return response.code, json.loads(await response.text())


class OllamaModelsTests(CompatDaemonTestCase):
    """The official ollama client's model routes, pushing to and pulling from the real registry."""

    async def test_models(self) -> None:
        if SKIP:
            self.skipTest(SKIP)
        await self.start()
        registry = RealRegistry(self.home / "registry")
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        client = ollama.Client(host=self.daemon.url, headers={"Connection": "close"})
        probe = await http.head(self.daemon.url + "/")
        self.assertEqual(probe.code, 200)
        version = await http.get(self.daemon.url + "/api/version")
        self.assertIn("version", json.loads(await version.text()))

        remote = f"{registry.host}/team/tiny:v1"
        await deferToThread(client.copy, "tiny", remote)
        names = [model.model for model in (await deferToThread(client.list)).models]
        self.assertEqual(sorted(names), sorted(["ai/tiny:latest", remote]))
        pushed = await deferToThread(lambda: [p.status for p in client.push(remote, stream=True)])
        self.assertEqual(pushed[-1], "success")
        self.assertTrue(any(status.startswith("pushing ") for status in pushed), pushed)

        await deferToThread(client.delete, remote)  # a copy: only that name goes
        names = [model.model for model in (await deferToThread(client.list)).models]
        self.assertEqual(names, ["ai/tiny:latest"])
        pulled = await deferToThread(lambda: [p.status for p in client.pull(remote, stream=True)])
        self.assertEqual((pulled[0], pulled[-1]), ("pulling manifest", "success"))
        self.assertEqual((await deferToThread(client.pull, remote)).status, "success")
        await deferToThread(client.delete, "tiny")
        await deferToThread(client.delete, remote)
        self.assertEqual((await deferToThread(client.list)).models, [])
        with self.assertRaises(ollama.ResponseError) as caught:
            await deferToThread(client.show, "tiny")
        self.assertEqual(caught.exception.status_code, 404)
