"""Scenario 5: a thousand slow streams at once for a minute, through mrunner and through nginx.

The upstream is the tests' stand-in runner, which sends each stream's events
a second apart, so the proxy holds many idle connections and relays a
steady trickle. One asyncio process drives every stream; each one that ends
is replaced until the minute is up. What counts: streams that did not end
with ``[DONE]`` (errors), the proxy's peak resident memory, and its CPU per
thousand events relayed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench import client
from bench.client import Exchange
from bench.report import Row, at_most, times
from bench.servers import Target
from bench.settings import CHAT, Settings, chat

RSS_GOAL_MB = 80
#: Seconds between samples of the proxy's memory, to tell a plateau from a leak.
SAMPLE_SECONDS = 10.0


@dataclass
class Tally:
    """What the client saw: streams, events, errors by kind, and the most streams open at once."""

    streams: int = 0
    events: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    open: int = 0
    most_open: int = 0
    rss_mb: list[float] = field(default_factory=list)

    def started(self) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)

    def ended(self, exchange: Exchange) -> None:
        self.open -= 1
        self.streams += 1
        self.events += exchange.events
        if exchange.failure:
            self.errors[exchange.failure.split(":")[0]] += 1


async def _drive(target: Target, body: dict[str, Any], settings: Settings) -> Tally:
    """C{settings.soak_streams} streams open at once (after a ramp), for C{settings.soak_seconds}."""
    tally = Tally()
    deadline = time.perf_counter() + settings.soak_seconds

    async def slot(number: int) -> None:
        await asyncio.sleep(settings.soak_ramp * number / settings.soak_streams)
        while time.perf_counter() < deadline:
            tally.started()
            tally.ended(await client.exchange(target.url, CHAT, body))

    async def sample() -> None:
        while True:
            tally.rss_mb.append(round(target.rss_mb(), 1))
            await asyncio.sleep(SAMPLE_SECONDS)

    sampling = asyncio.create_task(sample())
    await asyncio.gather(*(slot(n) for n in range(settings.soak_streams)))
    sampling.cancel()
    tally.rss_mb.append(round(target.rss_mb(), 1))
    return tally


def run(target: Target, model: str, settings: Settings) -> dict[str, Any]:
    """Drive C{target} and charge its processes; the figures as a dict."""
    test = {"events": settings.soak_events, "interval": settings.soak_interval}
    body = chat(model, max_tokens=settings.soak_events, stream=True, test=test)
    client.run(target.url, CHAT, {**body, "test": {"events": 1}})  # loads mrunner's runner
    cpu_before = target.cpu_seconds()
    tally = asyncio.run(_drive(target, body, settings))
    cpu = target.cpu_seconds() - cpu_before
    return {
        "errors": sum(tally.errors.values()),
        "peak_rss_mb": target.rss_mb("VmHWM"),
        "cpu_s_per_1000_events": cpu * 1000 / max(tally.events, 1),
        "details": {
            "streams": tally.streams,
            "events": tally.events,
            "most_open": tally.most_open,
            "errors_by_kind": dict(tally.errors),
            "cpu_s": cpu,
            f"rss_mb_every_{SAMPLE_SECONDS:g}s": tally.rss_mb,
        },
    }


def rows(results: dict[str, dict[str, Any]], settings: Settings) -> list[Row]:
    scenario = f"5 {settings.soak_streams} streams, {settings.soak_seconds:g} s"

    def figure(key: str) -> dict[str, float]:
        return {name: result[key] for name, result in results.items()}

    details = {name: result["details"] for name, result in results.items()}
    return [
        Row(scenario, "errors", figure("errors"), at_most(0), details),
        Row(scenario, "peak RSS MB", figure("peak_rss_mb"), at_most(RSS_GOAL_MB, "MB")),
        Row(scenario, "CPU s per 1000 events", figure("cpu_s_per_1000_events"), times("nginx", 2)),
    ]
