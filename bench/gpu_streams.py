"""``python -m bench.gpu_streams``: the GPU's own rates, the table after ``make gpu-check``'s (issue 50).

On the CUDA llama-server, with SmolLM2's layout whose trained context is raised so
that one KV cache holds every stream's thousand tokens and its prompt (L{layout}):

- streams: 1, 64 and 256 at once, each read to its end by scenario 13's C load
  (L{bench.realstreams.drive}), direct to a llama-server with mrunner's runner's own
  command line and through mrunner, the paths taking turns: the tokens/s the clients
  got and the slowest stream's end;
- verbosity: the 64 streams through a daemon whose runner logs at ``-lv 4`` (as every
  runner did before issue 48), against the same streams at the default verbosity;
- loads: a first request's seconds with no runner (cold: the process, the weights onto
  the GPU, the KV cache), then one for another model with one runner allowed (a swap),
  and back.

The answers are shorter than the cache's room (``--shapes``), so the table fits the lent
machine's one call beside the build and the checks; the rows go to ``streams.txt`` and
``streams.json`` as each is measured, so a call cut short keeps what it did. ``--cpu``
runs the same on this machine's CPU build with a few streams: the code path, rehearsed
without a GPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench import daemon, fastrunner, http, realstreams, servers
from bench.gpu_bundle import raise_trained_context
from bench.gpu_card import Gpu
from bench.realstreams import END, RATE, Figures, Shape
from bench.settings import CHAT, chat
from mrunner.backends.llamacpp.source import cached_executable

MODEL, OTHER = "ai/smollm2-long", "ai/smollm2-other"
#: Each stream's room in the cache: the longest answer asked for here and the chat prompt (~40 tokens).
ROOM, PROMPT = 1000, 64
#: Sized for the lent H200 (bench/gpu_device.sh's ``streams`` step, ~80 s): 1 stream at ~700 tokens/s,
#: 64 and 256 at ~1,600 (measured at 64 on the first lent machine), three passes of 64, two of the rest.
GPU_SHAPES, CPU_SHAPES = "1:1000,64:192,256:64", "1:32,4:16"
#: For each mode: its shapes, the count of streams measured again at -lv 4, the runner's threads
#: (0: llama-server's choice) and the build.
MODES = {"gpu": (GPU_SHAPES, 64, 0, "cuda"), "cpu": (CPU_SHAPES, 4, 1, "cpu")}
VERBOSE = ("-lv", "4")


@dataclass
class Plan:
    """What to measure, and with what: the shapes, the count measured again at ``-lv 4``, the builds."""

    server: Path
    gguf: Path
    shapes: list[Shape]
    verbose: int
    #: The runner's threads: 0 for llama-server's own choice.
    threads: int = 0

    @property
    def context(self) -> int:
        """Each stream's room: L{ROOM} or the longest answer, and the prompt, in whole 256s."""
        longest = max(ROOM, *(tokens for _, tokens in self.shapes)) + PROMPT
        return -(-longest // 256) * 256

    @property
    def parallel(self) -> int:
        return max(streams for streams, _ in self.shapes)

    def conf(self, executable: Path) -> str:
        lines = daemon.connections(self.parallel)
        return daemon.llama_conf(executable, self.parallel, self.threads, self.context, lines)


@dataclass
class Results:
    """The table so far, written to C{out} after every measurement."""

    device: str
    plan: Plan
    out: Path
    loads: dict[str, float] = field(default_factory=dict)
    streams: dict[Shape, dict[str, Figures]] = field(default_factory=dict)
    verbose: dict[str, Figures] = field(default_factory=dict)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "streams.txt").write_text(render(self))
        data = {
            "device": self.device,
            "context": {"per_stream": self.plan.context, "pool": self.plan.context * self.plan.parallel},
            "loads": self.loads,
            "streams": [{"streams": s, "tokens": t, **paths} for (s, t), paths in self.streams.items()],
            "verbose": {"streams": self.plan.verbose, **self.verbose},
        }
        (self.out / "streams.json").write_text(json.dumps(data, indent=1) + "\n")


def render(results: Results) -> str:
    plan = results.plan
    pool = plan.context * plan.parallel
    lines = [
        f"streams on {results.device}: {plan.gguf.name}, its trained context raised to {pool}"
        f" ({plan.parallel} streams x {plan.context} tokens in one cache)",
        "",
        f"{'streams x tokens':<18}{'direct tok/s':>14}{'mrunner tok/s':>15}{'ratio':>7}"
        f"{'direct end s':>14}{'mrunner end s':>15}",
    ]
    for (streams, tokens), paths in results.streams.items():
        direct, through = paths.get("direct"), paths.get("mrunner")
        ratio = f"{through[RATE] / direct[RATE]:.2f}" if direct and through else "-"
        lines.append(
            f"{f'{streams} x {tokens}':<18}{_figure(direct, RATE):>14}{_figure(through, RATE):>15}{ratio:>7}"
            f"{_figure(direct, END, 2):>14}{_figure(through, END, 2):>15}"
        )
    if (default := results.verbose.get("default")) and (logged := results.verbose.get("lv4")):
        lines += [
            "",
            f"{plan.verbose} streams through mrunner, the runner at -lv 4: {logged[RATE]:.0f} tokens/s"
            f" ({logged[RATE] / default[RATE]:.2f} x the default verbosity's {default[RATE]:.0f}),"
            f" slowest end {logged[END]:.2f} s (default {default[END]:.2f} s)",
        ]
    if results.loads:
        lines += ["", "loads: " + ", ".join(f"{name} {s:.2f} s" for name, s in results.loads.items())]
    return "\n".join(lines) + "\n"


def _figure(figures: Figures | None, key: str, places: int = 0) -> str:
    return "-" if figures is None else f"{figures[key]:.{places}f}"


def answer_seconds(url: str, model: str) -> float:
    """Seconds of one answer of a single token, the load it may wait for included."""
    began = time.perf_counter()
    with http.client(timeout=600.0) as client:
        client.post(url + CHAT, json=chat(model, 1, stream=False)).raise_for_status()
    return time.perf_counter() - began


def address(url: str) -> str:
    """The C load's name for C{url}."""
    return "tcp:" + url.removeprefix("http://")


@contextmanager
def mrunner(plan: Plan, home: Path, executable: Path, gguf: Path) -> Iterator[str]:
    """A daemon running C{executable}, C{gguf} imported as L{MODEL}: its URL."""
    with daemon.started(home, plan.conf(executable), "llama.cpp") as target:
        daemon.import_model(target.url, MODEL, gguf)
        yield target.url


def measure(plan: Plan, results: Results, logs: Path) -> None:
    """Loads, then each shape direct and through mrunner, then the verbose streams; saved as they come."""
    gguf = raise_trained_context(_copy(plan.gguf, logs / "smollm2-long.gguf"), plan.context * plan.parallel)
    load = fastrunner.build(logs)[1]
    with mrunner(plan, logs / "streams-home", plan.server, gguf) as url:
        with gguf.open("rb") as body, http.client(timeout=120.0) as client:
            other = {"name": OTHER, "context_size": str(plan.context // 2)}
            client.post(f"{url}/models/load", params=other, content=body).raise_for_status()
        for name, model in (("cold load", MODEL), ("swap", OTHER), ("swap back", MODEL)):
            results.loads[name] = answer_seconds(url, model)
            results.save()
        argv = daemon.runner_argv(url)
        with servers.llama_server(argv, logs, "streams-direct") as direct:
            paths = {"direct": address(direct.url), "mrunner": address(url)}
            realstreams.run_load(logs, load, paths["direct"], 1, 1, MODEL)
            for number, shape in enumerate(plan.shapes):
                names = list(paths)[number % 2 :] + list(paths)[: number % 2]
                for name in names:
                    figures = realstreams.drive(logs, load, paths[name], *shape, MODEL)
                    results.streams.setdefault(shape, {})[name] = figures
                    results.save()
    shape = next(shape for shape in plan.shapes if shape[0] == plan.verbose)
    results.verbose["default"] = results.streams[shape]["mrunner"]
    with mrunner(plan, logs / "streams-lv4", verbose_server(plan.server, logs), gguf) as url:
        answer_seconds(url, MODEL)
        results.verbose["lv4"] = realstreams.drive(logs, load, address(url), *shape, MODEL)
        results.save()


def verbose_server(server: Path, directory: Path) -> Path:
    """A llama-server that logs at L{VERBOSE} whatever it is asked: C{server}, its flags added first."""
    wrapper = directory / "llama-server-lv4"
    wrapper.write_text(f'#!/bin/sh\nexec "{server}" {" ".join(VERBOSE)} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _copy(source: Path, dest: Path) -> Path:
    shutil.copyfile(source, dest)
    return dest


def shapes(text: str) -> list[Shape]:
    """C{"1:1000,64:192"}: streams and tokens, each pair once, in order."""
    pairs = [pair.split(":") for pair in text.split(",")]
    return list(dict.fromkeys((int(streams), int(tokens)) for streams, tokens in pairs))


def plan_from(args: argparse.Namespace) -> Plan:
    """The plan the options ask for: the GPU's (the cached CUDA build), or with C{--cpu} this machine's
    CPU build on one thread and a few streams."""
    default_shapes, default_verbose, threads, variant = MODES["cpu" if args.cpu else "gpu"]
    wanted = shapes(args.shapes or default_shapes)
    verbose = args.verbose_streams or default_verbose
    if verbose not in (streams for streams, _ in wanted):
        raise SystemExit(f"--verbose-streams {verbose} is none of the shapes' counts")
    if args.gguf is None:
        from bench.gpu_bundle import smollm2

        args.gguf = smollm2()
    return Plan(args.server or cached_executable(variant=variant), args.gguf, wanted, verbose, threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_streams", description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="this machine's CPU build, a few streams")
    parser.add_argument("--server", type=Path, help="the llama-server (default: the cached CUDA build)")
    parser.add_argument("--gguf", type=Path, help="SmolLM2's GGUF or its layout (default: the venv's)")
    parser.add_argument("--shapes", help=f"streams:tokens,... (default {GPU_SHAPES}; --cpu {CPU_SHAPES})")
    parser.add_argument("--verbose-streams", type=int, help="the count measured again at -lv 4")
    parser.add_argument("--out", type=Path, default=Path("."), help="where streams.txt and .json go")
    parser.add_argument("--logs", type=Path, help="where the daemons' homes and logs go (kept)")
    args = parser.parse_args(argv)
    plan = plan_from(args)
    gpu = None if args.cpu else Gpu.find()
    if gpu is None and not args.cpu:
        print("gpu-streams: no NVIDIA GPU here (nvidia-smi does not answer): nothing measured.")
        return 0
    # SIGTERM (the script's time limit) unwinds, so every process started here is stopped by its PID.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="gpu-streams-"))
    logs.mkdir(parents=True, exist_ok=True)
    results = Results("CPU" if gpu is None else gpu.name, plan, args.out)
    try:
        measure(plan, results, logs)
    finally:
        print(render(results), end="", flush=True)
        if not args.logs:
            shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
