"""Cold start: mrunner's first request for an unloaded model against starting ``llama-server`` by hand.

Both are repeated and their medians compared, because one process start on a
shared two-core machine is too noisy to stand alone. Each includes a streamed
chat, so "first token" means the same thing on both sides.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from bench import daemon, servers
from bench.workload import Settings, stream_chat


def mrunner(url: str, settings: Settings) -> dict[str, float]:
    """Median seconds from a request for the model, with no runner loaded, to its first token."""
    samples = []
    for _ in range(settings.cold_starts):
        daemon.unload_all(url)
        stream = stream_chat(url, settings)
        samples.append(stream.first_token_at - stream.sent_at)
    return {"request_to_first_token_s": statistics.median(samples)}


def direct(runner_argv: Sequence[str], directory: Path, settings: Settings) -> dict[str, float]:
    """Median seconds from spawning ``llama-server`` to healthy, and to the first token of a request."""
    healthy, first_token = [], []
    for _ in range(settings.cold_starts):
        with servers.llama_server(runner_argv, directory) as started:
            stream = stream_chat(started.url, settings)
        healthy.append(started.healthy_at - started.spawned_at)
        first_token.append(stream.first_token_at - started.spawned_at)
    return {
        "spawn_to_healthy_s": statistics.median(healthy),
        "spawn_to_first_token_s": statistics.median(first_token),
    }
