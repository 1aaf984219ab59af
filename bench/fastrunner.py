"""Scenario 12, "fast runner": a proxy's CPU per streamed event at a GPU's rate, up to its ceiling.

The runner is a stand-in written in C (``bench/fast/runner.c``), built with the
system compiler into the run's directory: it streams OpenAI-shaped chunks at a
set rate to any number of streams on a UNIX socket, as llama-server does, and
costs almost nothing per event, so the proxy's own cost is what is seen. The
load is C too (``bench/fast/load.c``). The proxy (nginx, or mrunner with each
of its relays) is pinned to one core and the runner and the load to the other
(``taskset``), and each count of streams runs through each proxy in turn. What
counts is measured in a window after every stream has opened: events per
second delivered, the proxy's CPU per event and share of its core, the p99 gap
between a stream's events, and the ceiling, the events per second one full
core of the proxy would carry at that cost. The stand-in is also measured
direct at the largest count: the load is not the limit where direct delivers
what is offered.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench import daemon, servers
from bench.report import NO_GOAL, Row, share, times
from bench.rounds import interleave
from bench.servers import ServerFailed, Target
from bench.settings import CHAT, Settings, chat
from mrunner.testing.tinymodel import write_tiny_llama

SOURCES = Path(__file__).with_name("fast")
MODEL = "bench/fast"
RELAYS = ("fast", "twisted")
#: Seconds of slack after the window, so that no stream ends inside it: the window opens once every
#: stream has its first event, which a proxy's requests may take a second or two to reach.
SLACK = 2.5


def build(tmp: Path) -> tuple[Path, Path]:
    """The stand-in runner and the load, compiled with the system C compiler into C{tmp}."""
    built = []
    for name in ("runner", "load"):
        executable = tmp / f"fast-{name}"
        compiled = subprocess.run(
            ["cc", "-O2", "-o", str(executable), str(SOURCES / f"{name}.c")], capture_output=True, text=True
        )
        if compiled.returncode:
            raise ServerFailed(f"cc could not build bench/fast/{name}.c:\n{compiled.stderr}")
        built.append(executable)
    return built[0], built[1]


def cores() -> tuple[list[str], list[str]]:
    """C{taskset} prefixes for the proxy and for the runner and load: a core each, where there are two."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return [], []
    return ["taskset", "-c", str(available[1])], ["taskset", "-c", str(available[0])]


def request_file(tmp: Path, events: int, model: str = MODEL) -> Path:
    """A whole HTTP/1.1 request for a stream of C{events} of C{model}, as the load sends it."""
    body = json.dumps(chat(model, events, stream=True)).encode()
    head = f"POST {CHAT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    path = tmp / f"{model.replace('/', '-')}-request-{events}.http"
    path.write_bytes(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return path


class Load:
    """The C load, on its core, sending C{request} to a target (C{unix:PATH} or C{tcp:HOST:PORT})."""

    def __init__(self, prefix: list[str], executable: Path, tmp: Path, settings: Settings, events: int):
        self._argv = [*prefix, str(executable)]
        self._settings = settings
        self._request = request_file(tmp, events)
        self._warm = request_file(tmp, 1)

    def warm(self, target: str) -> None:
        """One short stream (it loads mrunner's runner)."""
        argv = [*self._argv, target, "1", "0", "0", str(self._warm)]
        subprocess.run(argv, capture_output=True, check=True, timeout=60)

    def drive(self, charged: Target | str, streams: int) -> dict[str, float]:
        """C{streams} at once through C{charged} (or to the address C{charged}, direct); the figures of
        the window, with the target's CPU in it."""
        target = charged if isinstance(charged, str) else "tcp:" + charged.url.removeprefix("http://")
        settings = self._settings
        window = [str(settings.fast_ramp), str(settings.fast_seconds)]
        marks = []
        result: dict[str, Any] = {}
        argv = [*self._argv, target, str(streams), *window, str(self._request)]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as process:
            assert process.stdout is not None
            for line in process.stdout:
                if line.strip() in ("window", "end"):
                    cpu = 0.0 if isinstance(charged, str) else charged.cpu_seconds()
                    marks.append((time.perf_counter(), cpu))
                elif line.startswith("{"):
                    result = json.loads(line)
        if len(marks) != 2 or not result:
            raise ServerFailed(f"the load at {target} ended early (exit {process.returncode})")
        (began, cpu_began), (ended, cpu_ended) = marks
        wall, cpu = ended - began, cpu_ended - cpu_began
        events = result["events"]
        return {
            "events_per_s": events / wall,
            "cpu_us_per_event": cpu * 1e6 / max(events, 1),
            "core_share": cpu / wall,
            "p99_gap_ms": result["p99_gap_ms"],
            "failed": result["failed"],
        }


@contextmanager
def mrunner(tmp: Path, runner: list[str], relay: str, streams: int, proxy: list[str]) -> Iterator[Target]:
    """mrunner on the proxy's core with C{relay}, its command backend's runner the stand-in."""
    gguf = tmp / "tiny-a.gguf"  # only imported: the stand-in never reads it
    if not gguf.exists():
        write_tiny_llama(gguf, seed=0)
    conf = daemon.trickle_conf(runner, streams, f'relay = "{relay}"')
    with daemon.started(tmp / f"fast-home-{relay}", conf, "trickle", prefix=proxy) as target:
        daemon.import_model(target.url, MODEL, gguf)
        yield target


def measure(tmp: Path, settings: Settings, progress: Callable[[str], None]) -> list[Row]:
    """Direct at the largest count, then nginx and mrunner's two relays, interleaved, at every count."""
    runner_exe, load_exe = build(tmp)
    proxy, near = cores()
    counts = [int(count) for count in settings.fast_streams.split(",")]
    events = int(settings.fast_rate * (settings.fast_ramp + settings.fast_seconds + SLACK))
    load = Load(near, load_exe, tmp, settings, events)
    runner = [*near, str(runner_exe), "{socket}", str(events), str(1 / settings.fast_rate)]
    upstream = tmp / "fast.sock"
    direct = [str(upstream) if arg == "{socket}" else arg for arg in runner]
    with ExitStack() as running:
        running.enter_context(servers.on_socket(direct, upstream, tmp / "fast-runner.log"))
        load.warm(f"unix:{upstream}")
        results = {"direct": {counts[-1]: load.drive(f"unix:{upstream}", counts[-1])}}
        targets = {"nginx": running.enter_context(servers.nginx(upstream, tmp / "nginx-10", proxy))}
        for relay in RELAYS:
            targets[relay] = running.enter_context(mrunner(tmp, runner, relay, counts[-1], proxy))
        for target in targets.values():
            load.warm("tcp:" + target.url.removeprefix("http://"))
        for count in counts:
            progress(f"12: {count} streams, {settings.fast_rounds} rounds of {', '.join(targets)}")
            rounds = interleave(targets, settings.fast_rounds, functools.partial(_drive, load, count))
            for name, samples in rounds.items():
                results.setdefault(name, {})[count] = {
                    key: statistics.median(sample[key] for sample in samples) for key in samples[0]
                }
    return rows(results, counts, settings)


def _drive(load: Load, count: int, _: str, target: Target) -> dict[str, float]:
    return load.drive(target, count)


def rows(results: dict[str, dict[int, dict[str, float]]], counts: list[int], settings: Settings) -> list[Row]:
    """A row per figure and count for each relay (mrunner's column), nginx and direct beside it."""
    table = []
    for relay in RELAYS:
        paths = {"direct": results["direct"], "nginx": results["nginx"], "mrunner": results[relay]}
        for count in counts:
            scenario = (
                f"12 fast runner, relay {relay}, {count} streams ({count * settings.fast_rate:.0f} offered/s)"
            )
            at = {path: by[count] for path, by in paths.items() if count in by}
            cpu = {path: figures["cpu_us_per_event"] for path, figures in at.items() if path != "direct"}
            table += [
                Row(scenario, "events/s delivered", _figure(at, "events_per_s"), NO_GOAL, at),
                Row(scenario, "CPU us per event", cpu, times("nginx", 1.5)),
                Row(scenario, "share of the proxy's core", _figure(at, "core_share")),
                Row(
                    scenario,
                    "ceiling events/s (a full core)",
                    {p: 1e6 / v for p, v in cpu.items()},
                    share("nginx", 0.8),
                ),
                Row(scenario, "p99 gap between events ms", _figure(at, "p99_gap_ms")),
                Row(scenario, "streams failed", _figure(at, "failed")),
            ]
    return table


def _figure(at: dict[str, dict[str, float]], key: str) -> dict[str, float]:
    return {path: figures[key] for path, figures in at.items()}
