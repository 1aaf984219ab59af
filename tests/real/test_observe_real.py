"""What a person sees of a real llama-server through mrunner: metrics, request records, one runner's log.

One daemon, the tiny model, the official openai client; see test_llamacpp_e2e for the set-up.
"""

from __future__ import annotations

import json
from typing import Any

from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase

SECRET = "sk-never-recorded-1234"
RUNNER = {"backend": "llama.cpp", "model": TINY, "mode": "completion"}


class ObserveTests(LlamaCppTestCase):
    async def get(self, path: str) -> tuple[int, bytes]:
        response = await http.get(self.daemon.url + path)
        return response.code, await response.content()

    async def test_metrics_records_and_logs_of_a_real_runner(self) -> None:
        await self.start()
        await self.tiny()
        client = OpenAI(base_url=self.daemon.url + "/v1", api_key=SECRET, max_retries=0)
        messages = [{"role": "user", "content": "hello"}]
        chat = await self.call(client.chat.completions.create, model=TINY, messages=messages, max_tokens=5)
        chunks = await self.call(
            lambda: list(
                client.chat.completions.create(model=TINY, messages=messages, max_tokens=6, stream=True)
            )
        )
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

        await self.check_metrics()
        await self.check_records(chat, streamed)
        await self.check_logs()

        code, _ = await self.post("/engines/unload", {"all": True})
        self.assertEqual(code, 200)
        families = await self.metrics()
        self.assertEqual(self.value(families, "mrunner_evictions_total", **RUNNER, reason="unload"), 1)
        self.assertEqual(self.value(families, "mrunner_runner_exits_total", **RUNNER, cause="stopped"), 1)

    async def metrics(self) -> dict[str, Any]:
        code, body = await self.get("/metrics")
        self.assertEqual(code, 200)
        # The parser refuses anything that is not valid exposition text: duplicate families, bad names.
        return {family.name: family for family in text_string_to_metric_families(body.decode())}

    def value(self, families: dict[str, Any], name: str, **labels: str) -> float:
        """The value of the one sample C{name} with exactly C{labels}."""
        samples = [s for family in families.values() for s in family.samples]
        (value,) = [s.value for s in samples if s.name == name and s.labels == labels]
        return float(value)

    async def check_metrics(self) -> None:
        families = await self.metrics()
        runner = [name for name in families if name.startswith("llamacpp_")]
        self.assertIn("llamacpp_prompt_tokens", runner, "llama-server's own metrics, renamed")
        plain = [name for name in families if ":" in name and not name.startswith("vllm:")]
        self.assertFalse(plain, "runner metrics are renamed plain; only the router signals keep vLLM's names")
        for name in runner:
            for sample in families[name].samples:
                self.assertEqual({k: sample.labels[k] for k in RUNNER}, RUNNER)
        self.assertGreater(self.value(families, "llamacpp_prompt_tokens_total", **RUNNER), 0)
        self.assertEqual(self.value(families, "mrunner_runners", **RUNNER, state="ready"), 1)
        self.assertEqual(self.value(families, "mrunner_load_seconds_count", model=TINY), 1)
        self.assertEqual(self.value(families, "mrunner_queue_wait_seconds_count", model=TINY), 2)
        self.assertGreater(self.value(families, "mrunner_runner_memory_estimate_bytes", **RUNNER), 0)
        self.assertGreater(self.value(families, "mrunner_runner_memory_measured_bytes", **RUNNER), 0)
        self.assertGreater(self.value(families, "mrunner_memory_budget_bytes"), 0)
        self.assertEqual(self.value(families, "mrunner_requests_total", mode="completion", status="200"), 2)

    async def check_records(self, chat: Any, streamed: str) -> None:
        code, body = await self.get("/engines/requests?model=tiny")
        self.assertEqual(code, 200)
        self.assertNotIn(SECRET.encode(), body)
        stream, whole = json.loads(body)
        self.assertEqual(
            (whole["status"], whole["route"], whole["completed"]), (200, "/v1/chat/completions", True)
        )
        self.assertEqual(whole["answer"]["text"], chat.choices[0].message.content)
        self.assertEqual(whole["tokens"]["completion"], 5)
        self.assertEqual(whole["request"]["body"]["messages"], [{"role": "user", "content": "hello"}])
        self.assertTrue(stream["answer"]["stream"])
        self.assertEqual(stream["answer"]["text"], streamed)
        self.assertEqual(stream["tokens"]["completion"], 6, "llama-server's timings in its last event")
        for record in (stream, whole):
            timings = record["timings"]
            self.assertLessEqual(timings["queued"], timings["ttfb"])
            self.assertLessEqual(timings["ttfb"], timings["total"])
            self.assertNotIn("authorization", record["request"]["headers"])

    async def check_logs(self) -> None:
        code, body = await self.get("/logs?source=tiny")
        self.assertEqual(code, 200)
        sources = {line.split("]")[0] + "]" for line in body.decode().splitlines()}
        self.assertEqual(sources, {"[ai_tiny_latest-completion]"})
        code, body = await self.get("/logs?source=nothing")
        self.assertEqual(code, 404)
        self.assertIn("daemon", json.loads(body)["error"]["message"])
