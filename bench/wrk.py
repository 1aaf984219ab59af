"""Request rate and latency from ``wrk``, and what the path's processes spent in CPU meanwhile.

wrk is C and costs the shared two cores little, where a Python load generator
would take CPU from the Python daemon it measures. It speaks TCP only, so
every path is a loopback port (see bench/README.md).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.servers import ServerFailed, Target

#: POSTs one JSON body over and over; at the end prints one JSON line of what the bench reads.
SCRIPT = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[{body}]==]

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\n{{"requests": %d, "micros": %d, "errors": %d, "p50_us": %d, "p99_us": %d}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass(frozen=True)
class Run:
    """One wrk run: requests per second, latency percentiles, and CPU seconds per request of the path."""

    rate: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_request: float


def script(
    directory: Path, body: dict[str, Any], headers: dict[str, str] | None = None, name: str = "post.lua"
) -> Path:
    """Write the wrk script that sends C{body} (with C{headers}); its path."""
    path = directory / name
    extra = "".join(f'wrk.headers["{field}"] = "{value}"\n' for field, value in (headers or {}).items())
    path.write_text(SCRIPT.format(body=json.dumps(body)) + extra)
    return path


def run(target: Target, path: str, lua: Path, connections: int, seconds: float) -> Run:
    """wrk against C{target} with C{connections} connections on one thread, for C{seconds}."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(lua), f"{target.url}{path}"]
    cpu_before = target.cpu_seconds()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
    cpu = target.cpu_seconds() - cpu_before
    if done.returncode != 0:
        raise ServerFailed(f"wrk failed ({done.returncode}): {done.stderr.strip()}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    if summary["errors"] or not summary["requests"]:
        raise ServerFailed(f"{target.url}{path}: wrk saw {summary['errors']} errors:\n{done.stdout}")
    return Run(
        rate=summary["requests"] / (summary["micros"] / 1e6),
        p50_ms=summary["p50_us"] / 1000,
        p99_ms=summary["p99_us"] / 1000,
        cpu_ms_per_request=cpu * 1000 / summary["requests"],
    )
