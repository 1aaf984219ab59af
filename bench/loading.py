"""Scenarios 3 and 4: what a request pays when its model is not loaded, against starting it by hand.

Direct is ``llama-server`` run by hand with mrunner's runner command line:
from spawn until ``/health`` says 200 for a cold load; SIGTERM to the old
server until it is reaped, plus that start, for a swap. mrunner's figure is
from the request until its first token, so it also carries the request
itself; nginx cannot load models and has no figure here.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench import client, daemon
from bench.report import Row, over
from bench.rounds import interleave, medians
from bench.servers import LOOPBACK, Process, Target, free_port, on_tcp
from bench.settings import CHAT, Settings, chat

#: What mrunner may add to a load or swap done by hand.
ALLOWANCE_MS = 50


def call(_: str, measure: Callable[[], float]) -> float:
    """Each path here is a function that measures it once."""
    return measure()


def first_token_ms(url: str, model: str) -> float:
    """Milliseconds from sending a one-token streamed chat for C{model} to its token."""
    exchange = client.run(url, CHAT, chat(model, max_tokens=1, stream=True))
    return exchange.ms_after_sending(exchange.token_times[0])


def start(argv: Sequence[str], directory: Path) -> tuple[Process, float]:
    """``llama-server`` with C{argv} on a loopback port; the process and milliseconds from spawn to ready."""
    port = free_port()
    process = Process(on_tcp(argv, port), directory / "llama-server-by-hand.log")
    try:
        ready_at = process.wait_ready(f"http://{LOOPBACK}:{port}/health")
    except BaseException:
        process.stop()
        raise
    return process, (ready_at - process.spawned_at) * 1000


def cold(mrunner: Target, argv: Sequence[str], model: str, settings: Settings, directory: Path) -> Row:
    """Scenario 3: llama-server's own start to ready, against mrunner's request to first token."""

    def direct() -> float:
        process, ms = start(argv, directory)
        process.stop()
        return ms

    def through_mrunner() -> float:
        daemon.unload_all(mrunner.url)
        return first_token_ms(mrunner.url, model)

    values = medians(interleave({"direct": direct, "mrunner": through_mrunner}, settings.load_rounds, call))
    return Row("3 cold load", "ms to ready / first token", values, over("direct", ALLOWANCE_MS, "ms"))


class _BySwapping:
    """Direct swaps: stop the one running ``llama-server``, start the other model's."""

    def __init__(self, argvs: Sequence[Sequence[str]], directory: Path):
        self._argvs = argvs
        self._directory = directory
        self._turn = 0
        self.process, _ = start(argvs[0], directory)
        self.stops: list[float] = []
        self.starts: list[float] = []

    def __call__(self) -> float:
        self.stops.append(self.process.stop() * 1000)
        self._turn += 1
        self.process, ms = start(self._argvs[self._turn % len(self._argvs)], self._directory)
        self.starts.append(ms)
        return self.stops[-1] + ms


@contextmanager
def _by_swapping(argvs: Sequence[Sequence[str]], directory: Path) -> Iterator[_BySwapping]:
    swapping = _BySwapping(argvs, directory)
    try:
        yield swapping
    finally:
        swapping.process.stop()


def swap(
    mrunner: Target,
    argvs: Sequence[Sequence[str]],
    models: Sequence[str],
    settings: Settings,
    directory: Path,
) -> Row:
    """Scenario 4: two models with room for one, asked for in turn, against stopping and starting by hand."""
    first_token_ms(mrunner.url, models[0])
    unloaded = itertools.cycle([*models[1:], models[0]])

    def through_mrunner() -> float:
        return first_token_ms(mrunner.url, next(unloaded))

    with _by_swapping(argvs, directory) as by_hand:
        paths: dict[str, Callable[[], float]] = {"direct": by_hand, "mrunner": through_mrunner}
        values = medians(interleave(paths, settings.load_rounds, call))
    details = {
        "direct_stop_ms": statistics.median(by_hand.stops),
        "direct_start_ms": statistics.median(by_hand.starts),
    }
    goal = over("direct", ALLOWANCE_MS, "ms")
    return Row("4 swap", "ms to stop + ready / first token", values, goal, details)
