"""Scenarios 1 and 6: small non-streamed chats (``max_tokens`` 1) through wrk.

At one connection the latency percentiles show what each path adds to a
request; at 8 and 32 connections the request rate shows how much load it
carries. The model's work is a cached prompt and one token, so the HTTP path
is most of the cost. The 32-connection runs also charge each path's
processes their CPU per request (scenario 6): the proxy alone for nginx and
mrunner, and llama-server itself for direct, for scale.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path

from bench import wrk
from bench.report import NO_GOAL, Row, added, share, times
from bench.rounds import interleave
from bench.servers import Target
from bench.settings import CHAT, Settings, chat

CONNECTIONS = (1, 8, 32)
WARM_UP_SECONDS = 1.0


def measure(targets: Mapping[str, Target], model: str, settings: Settings, directory: Path) -> list[Row]:
    lua = wrk.script(directory, chat(model, max_tokens=1, stream=False))
    for target in targets.values():
        wrk.run(target, CHAT, lua, max(CONNECTIONS), WARM_UP_SECONDS)

    def at(connections: int) -> dict[str, list[wrk.Run]]:
        return interleave(
            targets, settings.rounds, lambda _, t: wrk.run(t, CHAT, lua, connections, settings.wrk_seconds)
        )

    runs = {connections: at(connections) for connections in CONNECTIONS}

    def median(connections: int, figure: str) -> dict[str, float]:
        return {
            name: statistics.median(getattr(run, figure) for run in samples)
            for name, samples in runs[connections].items()
        }

    scenario = "1 chat, max_tokens 1"
    return [
        Row(scenario, "p50 latency ms, 1 conn", median(1, "p50_ms"), added("direct", 0.25)),
        Row(scenario, "p99 latency ms, 1 conn", median(1, "p99_ms"), NO_GOAL),
        Row(scenario, "requests/s, 8 conns", median(8, "rate"), share("nginx", 0.5)),
        Row(scenario, "requests/s, 32 conns", median(32, "rate"), share("nginx", 0.9)),
        Row(
            "6 CPU per request",
            "CPU ms/request, 32 conns",
            median(32, "cpu_ms_per_request"),
            times("nginx", 4),
        ),
    ]
