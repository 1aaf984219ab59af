"""``python -m bench``: mrunner against ``llama-server`` direct and behind nginx, one target at a time.

mrunner starts first: its runner's command line, read back from the kernel,
is the one the direct ``llama-server`` then runs with (TCP instead of the UNIX
socket), so the baseline mirrors mrunner by construction, and nginx proxies
to that same direct ``llama-server``. All three then stay up, idle but for the
one being measured: never two at once (see ``bench/workload.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2

from bench import coldstart, daemon, inputs, report, servers
from bench.workload import BadResponse, Settings, compare

#: Slots per runner, written into mrunner's tap.conf and so into the shared runner command line.
PARALLEL = 4
OUTPUT = Path(__file__).with_name("results-latest.json")


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run(tmp: Path, executable: Path, gguf: Path, settings: Settings, parallel: int) -> dict[str, Any]:
    """Start mrunner and time its cold start, then ``llama-server`` direct and nginx; compare all three."""
    home = tmp / "home"
    home.mkdir()
    with ExitStack() as running:
        progress(f"mrunner with {executable}")
        mrunner = running.enter_context(daemon.started(home, executable, parallel))
        daemon.import_model(mrunner, settings.model, gguf)
        mrunner_cold = coldstart.mrunner(mrunner, settings)
        runner_argv = daemon.runner_argv(mrunner)
        progress(f"llama-server direct: {' '.join(runner_argv)}")
        direct_cold = coldstart.direct(runner_argv, tmp, settings)
        direct = running.enter_context(servers.llama_server(runner_argv, tmp))
        nginx = running.enter_context(servers.nginx(direct.port, tmp / "nginx"))
        progress(f"measuring direct, nginx and mrunner in turn, {settings.rounds} rounds")
        targets = compare({"direct": direct.url, "nginx": nginx, "mrunner": mrunner}, settings)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "llama_server": str(executable),
        "model": str(gguf),
        "runner_argv": runner_argv,
        "settings": {**dataclasses.asdict(settings), "parallel": parallel},
        "targets": targets,
        "ratios": report.ratios(targets),
        "cold_start": report.cold_start(direct_cold, mrunner_cold),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Settings):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default
        )
    parser.add_argument("--parallel", type=int, default=PARALLEL, help="runner slots (llama-server -np)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write the JSON results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    settings = Settings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)})
    try:
        executable, gguf = inputs.llama_server(), inputs.smollm2()
    except inputs.MissingInput as e:
        progress(str(e))
        return 1
    began = time.monotonic()
    # Short, because runner sockets live under it and UNIX socket paths are limited to 108 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="mrb-", dir="/tmp"))
    try:
        results = run(tmp, executable, gguf, settings, args.parallel)
    except (servers.ServerFailed, BadResponse, httpx2.HTTPError) as e:
        progress(f"{e}\nlogs kept in {tmp}")
        return 1
    shutil.rmtree(tmp)
    print(report.table(results))
    report.write_json(results, args.output)
    progress(f"done in {time.monotonic() - began:.0f}s; results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
