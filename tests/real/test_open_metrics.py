"""``[cluster] open_metrics``: a scrape without a key sees the load signals, never a key's name or counts
(issue 35, A16). A daemon in this process, with tests/support/runner_program.py as its runner."""

from __future__ import annotations

from tests.support.daemon import eventually, http
from tests.support.daemon_cases import HI, MODEL, DaemonTestCase

ADMIN = {"Authorization": "Bearer admin-key"}
ALICE = {"Authorization": "Bearer alice-key"}


class OpenMetricsTests(DaemonTestCase):
    config_text = """
[http]
admin_api_keys = ["admin-key"]
[cluster]
open_metrics = true
[keys.alice]
key = "alice-key"
"""

    async def scrape(self, headers: dict[str, str] | None = None) -> str:
        response = await http.get(self.daemon.url + "/metrics", headers=headers or {})
        self.assertEqual(response.code, 200)
        return str(await response.text())

    def families(self, text: str) -> set[str]:
        return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}

    async def test_without_a_key_the_load_signals_alone(self) -> None:
        await self.start()
        response = await http.post(
            self.daemon.url + "/v1/chat/completions", json={"model": MODEL, "messages": HI}, headers=ALICE
        )
        self.assertEqual(response.code, 200, await response.text())
        keyed = await self.scrape(ALICE)
        self.assertIn('mrunner_key_requests_total{key="alice",status="200"} 1.0', keyed)
        for headers in (None, {"Authorization": "Bearer not-a-key"}):
            open_view = await self.scrape(headers)
            self.assertEqual(
                self.families(open_view),
                {
                    "vllm:num_requests_waiting",
                    "vllm:num_requests_running",
                    "vllm:kv_cache_usage_perc",
                    "vllm:lora_requests_info",
                    "mrunner_queue_waiting",
                    "mrunner_runners",
                    "mrunner_runner_requests_in_flight",
                },
            )
            self.assertNotIn("alice", open_view)
            self.assertIn(MODEL, open_view, "which models are resident is a load signal")
        response = await http.post(self.daemon.url + "/engines/unload", json={"all": True}, headers=ADMIN)
        self.assertEqual(response.code, 200, await response.text())
        await eventually(lambda: not self.daemon.scheduler.snapshot())
        self.assertNotIn(MODEL.split(":")[0], await self.scrape(), "a model served once is no signal")
        self.assertIn(MODEL.split(":")[0], await self.scrape(ADMIN))
