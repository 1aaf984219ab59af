"""The workload: the same client code against every target, so only the server side differs.

httpx2 with keep-alive, one ``Client`` per thread. Small requests
(``max_tokens: 1`` on a prompt llama-server has cached) cost the model almost
nothing, so their latency and rate are mostly what the HTTP path in front of
it costs. Streams use ``ignore_eos`` so every target generates the same
number of tokens at temperature 0.

The targets are measured one at a time, in rounds that rotate which goes
first: on a shared machine, background load drifts over a run, and
interleaving makes the drift hit every target alike, so the ratios hold even
when the absolute numbers move.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx2

from bench import http

#: Seconds any one request may take, so a wedged server fails the bench instead of hanging it.
REQUEST_TIMEOUT = 120.0
PROMPT = "The capital of France is"
STORY = [{"role": "user", "content": "Tell me a long story about a dragon and a lighthouse."}]


class BadResponse(Exception):
    """A target answered, but not with what every target must answer."""


@dataclass(frozen=True)
class Settings:
    """How much to measure: request and stream counts per target and round (about a minute in all)."""

    model: str = "ai/smollm2"
    rounds: int = 5
    warmup: int = 5
    latency_requests: int = 10
    throughput_requests: int = 48
    clients: int = 8
    streams: int = 2
    stream_tokens: int = 64
    cold_starts: int = 3


@dataclass(frozen=True)
class Stream:
    """One streamed chat completion, as C{perf_counter} times."""

    sent_at: float
    first_token_at: float
    last_token_at: float
    tokens: int

    @property
    def tokens_per_second(self) -> float:
        """Generation rate after the first token (which also pays for the prompt)."""
        return (self.tokens - 1) / (self.last_token_at - self.first_token_at)


@dataclass
class Samples:
    """Everything measured against one target, over all rounds."""

    latencies: list[float] = field(default_factory=list)
    requests: int = 0
    busy_seconds: float = 0.0
    streams: list[Stream] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        percentiles = statistics.quantiles(self.latencies, n=100, method="inclusive")
        return {
            "latency_p50_ms": percentiles[49] * 1000,
            "latency_p95_ms": percentiles[94] * 1000,
            "throughput_rps": self.requests / self.busy_seconds,
            "ttft_ms": statistics.median(s.first_token_at - s.sent_at for s in self.streams) * 1000,
            "tokens_per_s": statistics.median(s.tokens_per_second for s in self.streams),
        }


def new_client() -> httpx2.Client:
    return http.client(REQUEST_TIMEOUT)


def complete(client: httpx2.Client, url: str, model: str) -> float:
    """One ``max_tokens: 1`` completion; the seconds it took."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    start = time.perf_counter()
    client.post(f"{url}/v1/completions", json=body).raise_for_status()
    return time.perf_counter() - start


def stream_chat(url: str, settings: Settings) -> Stream:
    """A streamed chat of C{settings.stream_tokens} tokens, timing the first and last content events.

    Each stream gets a fresh connection: ``llama-server`` closes its connection
    after a streamed response (while still saying keep-alive), so a request
    reusing it would fail. Every target pays the same loopback connect.
    """
    body = {
        "model": settings.model,
        "messages": STORY,
        "max_tokens": settings.stream_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    token_times: list[float] = []
    with new_client() as client:
        sent_at = time.perf_counter()
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line.removeprefix("data: ")).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    token_times.append(time.perf_counter())
    if len(token_times) < 2:
        raise BadResponse(f"{url} streamed {len(token_times)} tokens; expected {settings.stream_tokens}")
    return Stream(sent_at, token_times[0], token_times[-1], len(token_times))


def compare(urls: Mapping[str, str], settings: Settings) -> dict[str, dict[str, float]]:
    """Warm every target up, then measure one at a time for C{settings.rounds} rounds; a summary each."""
    names = list(urls)
    for url in urls.values():
        warm_up(url, settings)
    samples = {name: Samples() for name in names}
    for number in range(settings.rounds):
        first = number % len(names)
        for name in names[first:] + names[:first]:
            measure_round(urls[name], settings, samples[name])
    return {name: target.summary() for name, target in samples.items()}


def warm_up(url: str, settings: Settings) -> None:
    """Fill the prompt cache and connection pools on the whole path before anything is timed."""
    with new_client() as client:
        for _ in range(settings.warmup):
            complete(client, url, settings.model)
    stream_chat(url, settings)


def measure_round(url: str, settings: Settings, samples: Samples) -> None:
    """Sequential latency, concurrent throughput, then streams, added to C{samples}."""
    with new_client() as client:
        complete(client, url, settings.model)  # opens the keep-alive connection, untimed
        samples.latencies += [complete(client, url, settings.model) for _ in range(settings.latency_requests)]
    requests, seconds = throughput(url, settings)
    samples.requests += requests
    samples.busy_seconds += seconds
    samples.streams += [stream_chat(url, settings) for _ in range(settings.streams)]


def throughput(url: str, settings: Settings) -> tuple[int, float]:
    """Requests done by C{settings.clients} concurrent clients, and the seconds from their common start.

    Each client connects and sends one untimed request before the start, so
    the timed window holds only requests on warm keep-alive connections.
    """
    per_client = settings.throughput_requests // settings.clients
    start = threading.Barrier(settings.clients + 1)

    def client_loop() -> None:
        with new_client() as client:
            complete(client, url, settings.model)
            start.wait(timeout=REQUEST_TIMEOUT)
            for _ in range(per_client):
                complete(client, url, settings.model)

    with ThreadPoolExecutor(settings.clients) as pool:
        futures = [pool.submit(client_loop) for _ in range(settings.clients)]
        start.wait(timeout=REQUEST_TIMEOUT)
        began = time.perf_counter()
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - began
    return per_client * settings.clients, elapsed
