"""The vLLM-named load signals from a real daemon over the pinned llama-server's own C{/slots}."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor

from mrunner.daemon.router_signals import kv_tokens
from mrunner.proxy.pool import RunnerPool, unix_connect
from mrunner.runners.checks import RunnerChecks
from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase


class SlotsTests(LlamaCppTestCase):
    async def test_kv_room_and_the_models_resident(self) -> None:
        """The runner's /slots names a whole context in every slot (--kv-unified-per-slot): the pool is
        their sum; an idle one holds nothing; /metrics names the model resident."""
        await self.start(parallel=2)
        await self.tiny()
        code, answer = await self.post(
            "/v1/chat/completions",
            {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        self.assertEqual(code, 200, answer)
        (runner,) = self.daemon.scheduler.snapshot()
        pool = RunnerPool(reactor, unix_connect(reactor), 2)
        self.addCleanup(pool.close)
        code, body = await RunnerChecks(pool.fetch).get(runner.socket, b"/slots")
        self.assertEqual(code, 200)
        slots = json.loads(body)
        self.assertEqual(len(slots), 2)
        self.assertEqual(kv_tokens(slots), (0, 2 * runner.context.in_force))

        response = await http.get(self.daemon.url + "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(await response.text())}
        self.assertEqual(families["vllm:kv_cache_usage_perc"].samples[0].value, 0.0)
        self.assertEqual(families["vllm:num_requests_running"].samples[0].value, 0)
        info = families["vllm:lora_requests_info"].samples[0].labels
        self.assertEqual(info["running_lora_adapters"], f"{TINY},ai/tiny")
