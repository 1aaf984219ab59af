"""``python -m bench``: mrunner against ``llama-server`` direct and behind nginx, scenario by scenario.

mrunner starts first and loads a tiny generated model: its runner's command
line, read back from the kernel, is the one the direct ``llama-server`` and
nginx's upstream then run with, so the baselines mirror mrunner by
construction. Each path has its own ``llama-server``; all stay up, idle but
for the one being measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2

from bench import (
    agents,
    conversation,
    daemon,
    fastrunner,
    inputs,
    keyed,
    loading,
    mixed,
    realstreams,
    report,
    servers,
    small,
    soak,
    store,
    streaming,
)
from bench.client import BadResponse
from bench.report import Row
from bench.servers import Target
from bench.settings import Settings
from mrunner.testing.tinymodel import write_tiny_llama

OUTPUT = Path(__file__).with_name("results-latest.json")
#: The two tiny models mrunner serves (two, so the swap has something to swap).
MODELS = ("bench/tiny", "bench/tiny-b")
TRICKLE_MODEL = "bench/trickle"


BEGAN = time.monotonic()


def progress(message: str) -> None:
    print(f"bench {time.monotonic() - BEGAN:4.0f}s: {message}", file=sys.stderr, flush=True)


@contextmanager
def llama_paths(tmp: Path, executable: Path, settings: Settings, threads: int) -> Iterator[Paths]:
    """mrunner with both tiny models, then llama-server direct and behind nginx with its runner's argv."""
    ggufs = [tmp / "tiny-a.gguf", tmp / "tiny-b.gguf"]
    for seed, gguf in enumerate(ggufs):
        if not gguf.exists():
            write_tiny_llama(gguf, seed=seed)
    home = tmp / f"home-threads-{threads}"
    with ExitStack() as running:
        progress(f"mrunner with {executable}, runner threads {threads or 'llama-server default'}")
        conf = daemon.llama_conf(executable, settings.parallel, threads)
        mrunner = running.enter_context(daemon.started(home, conf, "llama.cpp"))
        for name, gguf in zip(MODELS, ggufs, strict=True):
            daemon.import_model(mrunner.url, name, gguf)
        loading.first_token_ms(mrunner.url, MODELS[0])
        argv = daemon.runner_argv(mrunner.url)
        progress(f"llama-server direct and behind nginx: {' '.join(argv)}")
        direct = running.enter_context(servers.llama_server(argv, tmp, f"direct-{threads}"))
        upstream = tmp / f"upstream-{threads}.sock"
        upstream_argv = servers.replaced(argv, "--host", ["--host", str(upstream)])
        running.enter_context(servers.on_socket(upstream_argv, upstream, tmp / f"upstream-{threads}.log"))
        nginx = running.enter_context(servers.nginx(upstream, tmp / f"nginx-{threads}"))
        yield Paths({"direct": direct, "nginx": nginx, "mrunner": mrunner}, argv, ggufs)


@dataclasses.dataclass(frozen=True)
class Paths:
    targets: dict[str, Target]
    argv: list[str]
    ggufs: list[Path]


def llama_scenarios(tmp: Path, executable: Path, settings: Settings) -> list[Row]:
    """Scenarios 1, 2, 3, 4, 6, 7 and 8: everything that runs the real ``llama-server``, and the store."""
    model = MODELS[0]
    with llama_paths(tmp, executable, settings, settings.threads) as paths:
        targets, argv = paths.targets, paths.argv
        mrunner = targets["mrunner"]
        progress(f"1 and 6: small chats through wrk, {settings.rounds} rounds")
        rows = small.measure(targets, model, settings, tmp)
        progress(f"9: small chats, keyed and open, {settings.rounds} rounds")
        rows += keyed.measure(mrunner, executable, model, paths.ggufs[0], settings, tmp)
        progress(f"2: streams, {settings.rounds} rounds")
        rows += streaming.measure(targets, model, settings)
        progress(f"3: cold loads, {settings.load_rounds} rounds")
        rows.append(loading.cold(mrunner, argv, model, settings, tmp))
        progress(f"4: swaps, {settings.load_rounds} rounds")
        argv_b = servers.replaced(argv, "--model", ["--model", str(paths.ggufs[1])])
        rows.append(loading.swap(mrunner, [argv, argv_b], MODELS, settings, tmp))
        if settings.store_rounds:
            rows += pulls_and_imports(mrunner, settings, tmp)
    if settings.threads and settings.default_threads_rounds:
        rounds = settings.default_threads_rounds
        with llama_paths(tmp, executable, settings, 0) as paths:
            progress(f"2: streams with llama-server's default threads, {rounds} rounds")
            variant = dataclasses.replace(settings, rounds=rounds)
            rows += streaming.measure(paths.targets, model, variant, ", default threads")
    return rows


def store_scenarios(tmp: Path, executable: Path, settings: Settings) -> list[Row]:
    """Scenarios 7 and 8 alone (C{--store-only}): an mrunner and a registry, no runner or baseline."""
    conf = daemon.llama_conf(executable, settings.parallel, settings.threads)
    with daemon.started(tmp / "home-store", conf, "llama.cpp") as mrunner:
        return pulls_and_imports(mrunner, settings, tmp)


def pulls_and_imports(mrunner: Target, settings: Settings, tmp: Path) -> list[Row]:
    progress(f"7 and 8: pulls and imports of a 112 MB model, {settings.store_rounds} rounds")
    return store.measure(mrunner, settings.store_rounds, tmp)


def many_streams(tmp: Path, settings: Settings) -> list[Row]:
    """Scenario 5: its own mrunner, whose runner is the trickling stand-in, then nginx in front of one."""
    results = {}
    gguf = tmp / "tiny-a.gguf"  # only imported: the stand-in never reads it
    if not gguf.exists():
        write_tiny_llama(gguf, seed=0)
    command = servers.trickle_argv("{socket}", "{alias}")
    conf = daemon.trickle_conf(command, settings.soak_streams)
    progress(f"5: {settings.soak_streams} streams for {settings.soak_seconds:g}s through mrunner")
    with daemon.started(tmp / "trickle-home", conf, "trickle") as mrunner:
        daemon.import_model(mrunner.url, TRICKLE_MODEL, gguf)
        results["mrunner"] = soak.run(mrunner, TRICKLE_MODEL, settings)
    progress(f"5: {settings.soak_streams} streams for {settings.soak_seconds:g}s through nginx")
    upstream = tmp / "trickle.sock"
    argv = servers.trickle_argv(str(upstream), TRICKLE_MODEL)
    with (
        servers.on_socket(argv, upstream, tmp / "trickle.log"),
        servers.nginx(upstream, tmp / "nginx-5") as nginx,
    ):
        results["nginx"] = soak.run(nginx, TRICKLE_MODEL, settings)
    return soak.rows(results, settings)


def conversations(tmp: Path, executable: Path) -> list[Row]:
    """Scenario 10, with the first tiny model as the one SmolLM2 is swapped for."""
    progress("10: an agent's conversation on SmolLM2, its next turn warm and after swaps")
    tiny = tmp / "tiny-a.gguf"
    if not tiny.exists():
        write_tiny_llama(tiny, seed=0)
    return conversation.measure(tmp, executable, tiny)


def machine() -> dict[str, Any]:
    """What the figures were measured on, for the README and for comparing runs."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    try:
        nginx = subprocess.run(["nginx", "-v"], capture_output=True, text=True, check=False).stderr.strip()
    except FileNotFoundError:
        nginx = "not installed"  # --real-streams-only needs none
    return {
        "cpu": names[0] if names else platform.processor(),
        "cores": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nginx": nginx,
    }


def stop_cleanly_on_signals() -> None:
    """Ctrl-C and SIGTERM unwind the bench, so every process it started is stopped by its PID.

    SIGINT is set even where the shell started the bench ignoring it (a background job).
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def raise_fd_limit() -> None:
    """Let this process and the servers it starts hold a thousand streams' sockets (a proxy, two each)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Settings):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(field.default),
            default=field.default,
            help=field.metadata["help"] + " [default: %(default)s]",
        )
    parser.add_argument(
        "--default-threads",
        action="store_const",
        const=0,
        dest="threads",
        help="runners keep llama-server's default thread count (the same as --threads 0)",
    )
    parser.add_argument(
        "--store-only", action="store_true", help="run only scenarios 7 and 8, the pull and the import"
    )
    parser.add_argument(
        "--streams-only",
        action="store_true",
        help="run only scenario 5, the thousand streams (the stand-in runner: no llama-server needed)",
    )
    parser.add_argument(
        "--conversation-only",
        action="store_true",
        help="run only scenario 10, an agent's conversation on SmolLM2 across a swap, cache on and off",
    )
    parser.add_argument(
        "--fast-only",
        action="store_true",
        help="run only scenario 12, the fast runner (a C stand-in: no llama-server needed): about 3 min",
    )
    parser.add_argument(
        "--real-streams-only",
        action="store_true",
        help="run only scenario 13, concurrent streams on the real llama-server read to their ends",
    )
    parser.add_argument(
        "--agents-only",
        action="store_true",
        help="run only scenario 14, four agents' growing conversations at once on one SmolLM2 runner",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write the JSON results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    settings = Settings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)})
    try:
        executable = None if args.streams_only or args.fast_only else inputs.llama_server()
    except inputs.MissingInput as e:
        progress(str(e))
        return 1
    stop_cleanly_on_signals()
    raise_fd_limit()
    began = time.monotonic()
    # Short, because runner sockets live under it and UNIX socket paths are limited to 108 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="mrb-", dir="/tmp"))
    try:
        if args.fast_only:
            rows = fastrunner.measure(tmp, settings, progress)
        elif executable is None:
            rows = many_streams(tmp, settings)
        elif args.store_only:
            rows = store_scenarios(tmp, executable, settings)
        elif args.conversation_only:
            rows = conversations(tmp, executable)
        elif args.real_streams_only:
            rows = realstreams.measure(tmp, executable, settings, progress)
        elif args.agents_only:
            rows = agents.measure(tmp, executable, settings, progress)
        else:
            rows = llama_scenarios(tmp, executable, settings) + many_streams(tmp, settings)
            rows += conversations(tmp, executable)
            progress("11: mixed models under max_runners 1, order loaded against fifo")
            rows += mixed.rows(*mixed.measure())
            rows += fastrunner.measure(tmp, settings, progress)
            rows += realstreams.measure(tmp, executable, settings, progress)
            rows += agents.measure(tmp, executable, settings, progress)
    except (servers.ServerFailed, BadResponse, httpx2.HTTPError) as e:
        progress(f"{e}\nlogs kept in {tmp}")
        return 1
    except KeyboardInterrupt:
        progress(f"interrupted; every process stopped, logs kept in {tmp}")
        return 130
    shutil.rmtree(tmp)
    rows.sort(key=lambda row: int(row.scenario.split()[0]))
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "llama_server": executable and str(executable),
        "settings": dataclasses.asdict(settings),
        "seconds": round(time.monotonic() - began),
    }
    print(report.table(rows))
    report.write_json(meta, rows, args.output)
    progress(f"done in {meta['seconds']}s; results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
