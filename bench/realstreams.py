"""Scenario 13, "real streams": several clients at once on the real ``llama-server``, each answer read
to its end, through each relay and direct, on an idle machine and with every core kept busy.

A stream is over for its client when the response's end has come, not when its last event has:
llama-server writes a chunked answer's end in two sends (``0\\r\\n``, then ``\\r\\n``), and relays that
passed them on apart kept a client that looks for the end in its last read waiting a minute for
the idle close (issue 48). Scenarios 2 and 12 measure events; this one times ends. The client is
scenario 12's C load (``bench/fast/load.c``), which finds the end across reads as curl and httpx
do; it reports the slowest stream's seconds from its connect to its end, and the run's seconds
from the first connect to the last end: the tokens over them are the rate the clients got, the
requests' own cost and an end held back included.

mrunner runs once per ``[http] relay``, each with its own runner of the tiny model; the direct
``llama-server`` runs the first runner's command line, read back from the kernel. The paths take
turns, the first rotating, at each shape (streams x tokens): one round each, so on a shared
machine the figures are noisy and the ratios are what to read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from bench import daemon, fastrunner, servers
from bench.client import BadResponse
from bench.report import Goal, Row, share
from bench.settings import Settings
from mrunner.testing.tinymodel import write_tiny_llama

MODEL = "bench/tiny"
#: Streams at once in the sweep of answer sizes.
SWEEP_STREAMS = 4
#: Each request's context: the prompt (about 30 tokens) and the sweep's longest answer fit.
CONTEXT = 512
IDLE, BUSY = "idle", "cores busy"
RATE, END = "tokens_per_s", "slowest_s"
#: Seconds one load may take: a stall (the idle close) is a minute, 256 streams on busy cores a few.
LOAD_TIMEOUT = 600.0
SLOWEST_END = Goal("<= 1.5 x direct + 0.5 s", lambda v: _excess(v) <= 0)

Shape = tuple[int, int]  # (streams, tokens each)
Figures = dict[str, float]


def shapes(settings: Settings) -> list[Shape]:
    """Every count of streams with its answers' size, then the sweep's sizes, each shape once."""
    return list(dict.fromkeys(counts(settings) + sweep(settings)))


def counts(settings: Settings) -> list[Shape]:
    """C{real_streams}' counts of streams at once, each with its answers' size (C{256:32})."""
    pairs = [pair.split(":") for pair in settings.real_streams.split(",")]
    return [(int(streams), int(tokens)) for streams, tokens in pairs]


def sweep(settings: Settings) -> list[Shape]:
    """C{real_sizes}' answer sizes (first,last,step) at C{SWEEP_STREAMS} streams."""
    first, last, step = (int(n) for n in settings.real_sizes.split(","))
    return [(SWEEP_STREAMS, tokens) for tokens in range(first, last + 1, step)]


@contextmanager
def paths(tmp: Path, executable: Path, settings: Settings, load: Path) -> Iterator[dict[str, str]]:
    """mrunner with each relay, its runner loaded, and llama-server direct: the load's address of each."""
    gguf = tmp / "tiny-a.gguf"
    if not gguf.exists():
        write_tiny_llama(gguf, seed=0)
    streams = max(streams for streams, _ in shapes(settings))
    addresses = {}
    with ExitStack() as running:
        for relay in fastrunner.RELAYS:
            lines = daemon.connections(streams) + f'relay = "{relay}"\n'
            conf = daemon.llama_conf(executable, streams, settings.threads, CONTEXT, lines)
            target = running.enter_context(daemon.started(tmp / f"real-home-{relay}", conf, "llama.cpp"))
            daemon.import_model(target.url, MODEL, gguf)
            addresses[relay] = "tcp:" + target.url.removeprefix("http://")
        for address in addresses.values():
            run_load(tmp, load, address, 1, 1)  # loads the runner
        argv = daemon.runner_argv("http://" + addresses[fastrunner.RELAYS[0]].removeprefix("tcp:"))
        direct = running.enter_context(servers.llama_server(argv, tmp, "real-direct"))
        yield {"direct": "tcp:" + direct.url.removeprefix("http://"), **addresses}


@contextmanager
def cores_busy(tmp: Path) -> Iterator[None]:
    """A busy loop beside the run for each core, each stopped by its PID when the block ends."""
    with ExitStack() as loops:
        for core in range(len(os.sched_getaffinity(0))):
            busy = [sys.executable, "-c", "while True: pass"]
            loops.enter_context(servers.running(busy, tmp / f"busy-{core}.log"))
        yield


def drive(tmp: Path, load: Path, address: str, streams: int, tokens: int, model: str = MODEL) -> Figures:
    """The rate the clients got and the slowest end, of L{run_load}."""
    result = run_load(tmp, load, address, streams, tokens, model)
    return {RATE: streams * tokens / result["elapsed_s"], END: result["slowest_s"]}


def run_load(
    tmp: Path, load: Path, address: str, streams: int, tokens: int, model: str = MODEL
) -> dict[str, float]:
    """C{streams} streams of C{tokens} of C{model} sent at once to C{address}, each read to its end:
    the load's JSON."""
    request = fastrunner.request_file(tmp, tokens, model)
    argv = [str(load), address, str(streams), "0", "0", str(request)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=LOAD_TIMEOUT, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise BadResponse(f"the load at {address} ended with {done.returncode}: {done.stderr[-500:]}")
    result = json.loads(lines[-1])
    if result["failed"] or result["all_events"] < streams * tokens:
        raise BadResponse(f"{address}, {streams} x {tokens} tokens: {result}")
    return result


def measure(tmp: Path, executable: Path, settings: Settings, progress: Callable[[str], None]) -> list[Row]:
    """Every shape through every path, the first path rotating, idle and then with the cores busy."""
    load = fastrunner.build(tmp)[1]
    results: dict[str, dict[str, dict[Shape, Figures]]] = {}
    with paths(tmp, executable, settings, load) as addresses:
        names = list(addresses)
        for condition in (IDLE, BUSY):
            progress(f"13: real streams, {condition}: {', '.join(names)} at each shape")
            by_path = results.setdefault(condition, {name: {} for name in names})
            with cores_busy(tmp) if condition == BUSY else nullcontext():
                for number, shape in enumerate(shapes(settings)):
                    first = number % len(names)
                    for name in names[first:] + names[:first]:
                        by_path[name][shape] = drive(tmp, load, addresses[name], *shape)
    return rows(results, settings)


def rows(results: dict[str, dict[str, dict[Shape, Figures]]], settings: Settings) -> list[Row]:
    """For each relay and condition: tokens/s and the slowest end at each count of streams, then the
    sweep's worst size for each (every size is in the row's details)."""
    table = []
    for condition, by_path in results.items():
        for relay in fastrunner.RELAYS:
            scenario = f"13 real streams, relay {relay}, {condition}"
            pair = {"direct": by_path["direct"], "mrunner": by_path[relay]}
            for shape in counts(settings):
                label = f"{shape[0]} x {shape[1]}"
                table.append(
                    Row(scenario, f"tokens/s, {label}", _at(pair, shape, RATE), share("direct", 0.95))
                )
                table.append(Row(scenario, f"slowest end s, {label}", _at(pair, shape, END), SLOWEST_END))
            table += _sweep_rows(scenario, pair, sweep(settings))
    return table


def _sweep_rows(scenario: str, pair: dict[str, dict[Shape, Figures]], shapes: list[Shape]) -> list[Row]:
    """The sweep's size furthest from each goal, every size in the details."""
    details = {f"{s} x {t}": {path: figures[(s, t)] for path, figures in pair.items()} for s, t in shapes}
    label = f"{SWEEP_STREAMS} x {shapes[0][1]}-{shapes[-1][1]}"
    rate = min(shapes, key=lambda shape: _ratio(_at(pair, shape, RATE)))
    end = max(shapes, key=lambda shape: _excess(_at(pair, shape, END)))
    return [
        Row(
            scenario,
            f"tokens/s, {label}, worst ({rate[1]})",
            _at(pair, rate, RATE),
            share("direct", 0.95),
            details,
        ),
        Row(scenario, f"slowest end s, {label}, worst ({end[1]})", _at(pair, end, END), SLOWEST_END),
    ]


def _at(pair: dict[str, dict[Shape, Figures]], shape: Shape, key: str) -> dict[str, float]:
    return {path: figures[shape][key] for path, figures in pair.items()}


def _ratio(values: Mapping[str, float]) -> float:
    return values["mrunner"] / values["direct"]


def _excess(values: Mapping[str, float]) -> float:
    """Seconds past the slowest end's goal (negative: within it)."""
    return values["mrunner"] - (1.5 * values["direct"] + 0.5)
