"""Ratios against the baselines, printed as a compact table and written as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TARGETS = ("direct", "nginx", "mrunner")
#: Each ratio is the first target's number over the second's.
RATIOS = (("mrunner", "direct"), ("nginx", "direct"), ("mrunner", "nginx"))
#: (key, label, which way is better): a ratio alone does not say whether above 1 is good.
METRICS = (
    ("latency_p50_ms", "latency p50 ms", "lower"),
    ("latency_p95_ms", "latency p95 ms", "lower"),
    ("throughput_rps", "throughput req/s", "higher"),
    ("ttft_ms", "stream TTFT ms", "lower"),
    ("tokens_per_s", "stream tokens/s", "higher"),
)


def ratios(targets: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """C{{"mrunner/direct": {metric: ratio}}} and so on, for every metric in the table."""
    return {f"{a}/{b}": {key: targets[a][key] / targets[b][key] for key, _, _ in METRICS} for a, b in RATIOS}


def cold_start(direct: dict[str, float], mrunner: dict[str, float]) -> dict[str, float]:
    """mrunner's first request on an unloaded model against starting ``llama-server`` by hand."""
    first_token = mrunner["request_to_first_token_s"]
    return {
        "direct_spawn_to_healthy_s": direct["spawn_to_healthy_s"],
        "direct_spawn_to_first_token_s": direct["spawn_to_first_token_s"],
        "mrunner_request_to_first_token_s": first_token,
        "mrunner/direct_first_token": first_token / direct["spawn_to_first_token_s"],
        "mrunner/direct_healthy": first_token / direct["spawn_to_healthy_s"],
    }


def table(results: dict[str, Any]) -> str:
    """The steady-state numbers, their ratios, and the cold start, for a terminal."""
    names = [f"{a}/{b}" for a, b in RATIOS]
    header = f"{'':24}" + "".join(f"{t:>10}" for t in TARGETS) + "".join(f"{n:>16}" for n in names)
    lines = [header]
    for key, label, better in METRICS:
        row = f"{f'{label} ({better})':24}"
        row += "".join(f"{results['targets'][t][key]:>10.1f}" for t in TARGETS)
        row += "".join(f"{results['ratios'][n][key]:>15.2f}x" for n in names)
        lines.append(row)
    cold = results["cold_start"]
    lines += [
        "",
        f"cold start, median of {results['settings']['cold_starts']}:",
        f"  llama-server direct: spawn -> healthy {cold['direct_spawn_to_healthy_s']:.2f}s, "
        f"spawn -> first token {cold['direct_spawn_to_first_token_s']:.2f}s",
        f"  mrunner: first request -> first token {cold['mrunner_request_to_first_token_s']:.2f}s = "
        f"{cold['mrunner/direct_first_token']:.2f}x direct spawn -> first token, "
        f"{cold['mrunner/direct_healthy']:.2f}x spawn -> healthy",
    ]
    return "\n".join(lines)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2) + "\n")
