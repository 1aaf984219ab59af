"""The load signals under vLLM's names that cluster routers read from C{/metrics}."""

from __future__ import annotations

import json

import attrs
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.daemon.router_signals import RouterSignals, kv_tokens, resident_names, router_families
from mrunner.values import State
from tests.support.metrics import LLAMA_METRICS, snapshot

# The pinned llama-server's GET /slots (-c 1024 -np 2 --kv-unified --kv-unified-per-slot 512), one
# slot busy, trimmed.
SLOTS = [
    {"id": 0, "n_ctx": 512, "speculative": False, "is_processing": False},
    {
        "id": 1,
        "n_ctx": 512,
        "speculative": False,
        "is_processing": True,
        "id_task": 2,
        "n_prompt_tokens": 29,
        "n_prompt_tokens_processed": 29,
        "n_prompt_tokens_cache": 0,
        "params": {"max_tokens": 100},
        "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": 73, "n_decoded": 27}],
    },
]


def get(socket: str, path: bytes) -> Deferred[tuple[int, bytes]]:
    """C{slow} never answers; C{bare} has neither /slots nor /metrics; the others answer as llama-server."""
    if socket == "/run/slow.sock":
        return Deferred()
    if socket == "/run/bare.sock":
        return succeed((404, b"not here"))
    return succeed((200, json.dumps(SLOTS).encode() if path == b"/slots" else LLAMA_METRICS))


def values(families) -> dict[str, tuple[dict[str, str], float]]:
    text = generate_latest(families).decode()
    parsed = text_string_to_metric_families(text)
    return {f.name: (f.samples[0].labels, f.samples[0].value) for f in parsed if f.name.startswith("vllm:")}


class KVTests(SynchronousTestCase):
    def test_busy_slots_tokens_over_the_context(self) -> None:
        self.assertEqual(kv_tokens(SLOTS), (29 + 27, 1024))

    def test_idle_slots_hold_nothing(self) -> None:
        self.assertEqual(kv_tokens([{**SLOTS[1], "is_processing": False}, SLOTS[0]]), (0, 1024))

    def test_never_more_than_the_context(self) -> None:
        self.assertEqual(kv_tokens([{**SLOTS[1], "n_prompt_tokens": 9000}]), (512, 512))

    def test_what_is_not_slots_counts_nothing(self) -> None:
        for answer in ({}, None, [1, "x"], [{"n_ctx": "512", "is_processing": True, "next_token": [7]}]):
            self.assertEqual(kv_tokens(answer), (0, 0), answer)


class FamiliesTests(SynchronousTestCase):
    def test_queue_leases_kv_and_the_models_resident(self) -> None:
        runners = [
            attrs.evolve(snapshot("a"), in_use=2),
            attrs.evolve(snapshot("b", State.DRAINING), in_use=1),
            snapshot("c", State.LOADING),
        ]
        families = list(router_families(runners, 3, [(56, 512), (0, 512)], 4, 1700000000.0))
        by_name = {f.name: f.samples for f in families}
        self.assertEqual(by_name["vllm:num_requests_waiting"][0].value, 3)
        self.assertEqual(by_name["vllm:num_requests_running"][0].value, 3)
        self.assertEqual(by_name["vllm:kv_cache_usage_perc"][0].value, 56 / 1024)
        (info,) = by_name["vllm:lora_requests_info"]
        self.assertEqual(
            info.labels,
            {
                "running_lora_adapters": "ai/a:latest,ai/a,ai/b:latest,ai/b",
                "waiting_lora_adapters": "ai/c:latest,ai/c",
                "max_lora": "4",
            },
        )
        self.assertEqual(info.value, 1700000000.0)

    def test_an_empty_node(self) -> None:
        by_name = {f.name: f.samples[0] for f in router_families([], 0, [], 4, 0.0)}
        self.assertEqual(by_name["vllm:kv_cache_usage_perc"].value, 0.0)
        self.assertEqual(by_name["vllm:lora_requests_info"].labels["running_lora_adapters"], "")

    def test_resident_names(self) -> None:
        self.assertEqual(resident_names("ai/x:latest"), ["ai/x:latest", "ai/x"])
        self.assertEqual(resident_names("ai/x:q4"), ["ai/x:q4"])


class SignalsTests(SynchronousTestCase):
    def test_scraped_beside_the_runners_metrics_within_the_bound(self) -> None:
        clock = Clock()
        clock.advance(1700000000)
        signals = RouterSignals(get, clock, lambda: 2, lambda: 4)
        runners = [attrs.evolve(snapshot("r0"), in_use=1), snapshot("slow"), snapshot("bare")]
        d = signals.scrape(runners)
        self.assertNoResult(d)  # the slow runner holds it, for one second at most
        clock.advance(1)
        families = self.successResultOf(d)
        found = values(families)
        self.assertEqual(found["vllm:num_requests_waiting"][1], 2)
        self.assertEqual(found["vllm:num_requests_running"][1], 1)
        self.assertEqual(found["vllm:kv_cache_usage_perc"][1], 56 / 1024, "the bare runner has no context")
        self.assertIn("ai/slow:latest", found["vllm:lora_requests_info"][0]["running_lora_adapters"])
        names = {f.name for f in families.collect()}
        self.assertIn("llamacpp_prompt_tokens", names, "the runners' own metrics are still there")
