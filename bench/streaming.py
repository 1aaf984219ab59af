"""Scenario 2: streamed chats of 256 tokens, timed event by event at the client.

The first byte shows what a path adds before anything arrives; tokens per
second what it costs per event; and the gaps between events whether it holds
any back: a path that buffers delivers bursts, with near-zero gaps inside
them and long ones between, so its 99th-percentile gap grows. The CPU per
event is the proxy's own for nginx and mrunner, and llama-server's (which
generates the token) for direct: on two cores, what a proxy spends per event
is taken from generation.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping

from bench import client
from bench.client import BadResponse, Exchange
from bench.report import NO_GOAL, Row, added, over, share, times
from bench.rounds import interleave
from bench.servers import Target
from bench.settings import CHAT, Settings, chat


def measure(targets: Mapping[str, Target], model: str, settings: Settings, variant: str = "") -> list[Row]:
    body = chat(model, settings.stream_tokens, stream=True)

    def streams(_: str, target: Target) -> tuple[list[Exchange], float]:
        """A round's streams, and the CPU seconds the path's processes spent on them."""
        cpu_before = target.cpu_seconds()
        exchanges = [client.run(target.url, CHAT, body) for _ in range(settings.streams_per_round)]
        return exchanges, target.cpu_seconds() - cpu_before

    for target in targets.values():
        client.run(target.url, CHAT, body)  # warm-up
    rounds = interleave(targets, settings.rounds, streams)
    samples = {name: [e for batch, _ in batches for e in batch] for name, batches in rounds.items()}
    cpu_per_event = {
        name: sum(cpu for _, cpu in batches) * 1e6 / sum(len(e.token_times) for e in samples[name])
        for name, batches in rounds.items()
    }
    for name, exchanges in samples.items():
        for e in exchanges:
            if len(e.token_times) != settings.stream_tokens:
                raise BadResponse(f"{name} streamed {len(e.token_times)} of {settings.stream_tokens} tokens")

    def per_path(figure: Callable[[Exchange], float]) -> dict[str, float]:
        return {name: statistics.median(figure(e) for e in exchanges) for name, exchanges in samples.items()}

    gaps = {
        name: statistics.quantiles(
            [b - a for e in exchanges for a, b in itertools.pairwise(e.token_times)], n=100
        )[98]
        * 1000
        for name, exchanges in samples.items()
    }
    scenario = f"2 stream, {settings.stream_tokens} tokens{variant}"
    return [
        Row(
            scenario,
            "first byte ms",
            per_path(lambda e: e.ms_after_sending(e.first_byte_at)),
            added("direct", 0.25),
        ),
        Row(scenario, "total ms", per_path(lambda e: e.ms_after_sending(e.token_times[-1])), NO_GOAL),
        Row(scenario, "tokens/s", per_path(tokens_per_second), share("direct", 0.98)),
        Row(scenario, "p99 gap between events ms", gaps, over("direct", 1, "ms")),
        Row(scenario, "CPU us per event", cpu_per_event, times("nginx", 1.5)),
    ]


def tokens_per_second(exchange: Exchange) -> float:
    """Generation rate after the first token (which also pays for the prompt)."""
    times = exchange.token_times
    return (len(times) - 1) / (times[-1] - times[0])
