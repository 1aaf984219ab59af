"""Scenario 9: what a named key costs a request: the same small chat through wrk, open and keyed.

The keyed mrunner has one named key with every limit on, each too high to refuse (models,
requests and tokens a minute, tokens a day, requests at once), so each request is looked up,
admitted, metered and counted in usage; the open one (scenario 1's mrunner) has no key at all.
Both run the same runner command line, measured in alternation, at one connection (what a key
adds to a request's latency) and at 32 (what it adds to the daemon's CPU per request).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench import daemon, wrk
from bench.report import Goal, Row
from bench.rounds import interleave
from bench.servers import Target
from bench.settings import CHAT, Settings, chat

KEY = "bench-key"
KEYED_CONF = f"""
[keys.bench]
key = "{KEY}"
admin = true
models = ["bench/*"]
requests_per_minute = 1000000000
tokens_per_minute = 1000000000
tokens_per_day = 1000000000000
max_concurrent = 100000
"""
CONNECTIONS = (1, 32)


def measure(
    open_mrunner: Target, executable: Path, model: str, gguf: Path, settings: Settings, tmp: Path
) -> list[Row]:
    conf = daemon.llama_conf(executable, settings.parallel, settings.threads) + KEYED_CONF
    body = chat(model, max_tokens=1, stream=False)
    scripts = {
        "open": wrk.script(tmp, body, name="open.lua"),
        "keyed": wrk.script(tmp, body, {"Authorization": f"Bearer {KEY}"}, name="keyed.lua"),
    }
    authorization = {"Authorization": f"Bearer {KEY}"}
    with daemon.started(tmp / "home-keyed", conf, "llama.cpp", authorization) as keyed:
        daemon.import_model(keyed.url, model, gguf, authorization)
        targets = {"open": open_mrunner, "keyed": keyed}
        for name, target in targets.items():
            wrk.run(target, CHAT, scripts[name], max(CONNECTIONS), 1.0)

        def sample(connections: int) -> dict[str, list[wrk.Run]]:
            return interleave(
                targets,
                settings.rounds,
                lambda name, t: wrk.run(t, CHAT, scripts[name], connections, settings.wrk_seconds),
            )

        runs = {connections: sample(connections) for connections in CONNECTIONS}

    def row(connections: int, figure: str, label: str, allowance: float) -> Row:
        medians = {
            name: statistics.median(getattr(run, figure) for run in samples)
            for name, samples in runs[connections].items()
        }
        goal = Goal(
            f"<= open ({medians['open']:.3g}) + {allowance:g}",
            lambda v: v["mrunner"] <= medians["open"] + allowance,
        )
        return Row(
            "9 keyed request", f"{label} (open {medians['open']:.3g})", {"mrunner": medians["keyed"]}, goal
        )

    return [
        row(1, "p50_ms", "p50 latency ms, 1 conn", 0.1),
        row(32, "cpu_ms_per_request", "CPU ms/request, 32 conns", 0.1),
    ]
