"""``python -m bench.profile``: where mrunner's daemon spends its CPU on the proxy path, sampled by py-spy.

Starts mrunner with the bench's tiny model and samples the daemon while wrk
sends small chats at 32 connections, then while streams run one after
another: the loads of scenarios 1, 2 and 6. Prints, for each, the frames with
the most samples, by their own time and with what they call. py-spy reads the
process from outside (ptrace), so the daemon runs unmodified; it counts only
samples that hold the GIL, so system calls (send, recv, epoll) are not in it.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import client, daemon, inputs, wrk
from bench.settings import CHAT, Settings, chat
from mrunner.testing.tinymodel import write_tiny_llama

MODEL = "bench/tiny"
TOP = 25


def top(raw: Path, count: int) -> str:
    """The C{count} frames with most samples of their own, and with most samples under them."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = stack.split(";")
        total += int(samples)
        own[frames[-1]] += int(samples)
        for frame in set(frames):
            under[frame] += int(samples)
    lines = [f"{total} samples"]
    for title, counter in (("own", own), ("with callees", under)):
        lines.append(f"\ntop {count} by {title}:")
        lines += [f"{n / total:6.1%}  {frame}" for frame, n in counter.most_common(count)]
    return "\n".join(lines)


@contextmanager
def sampling(pid: int, output: Path) -> Iterator[None]:
    """py-spy on C{pid} for the length of the block: only samples that hold the GIL, so Python's own CPU."""
    spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw", "--nonblocking"]
    spy += ["--gil", "--rate", "250", "--pid", str(pid), "--output", str(output)]
    with subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as spying:
        try:
            time.sleep(1)  # py-spy attaches
            yield
        finally:
            spying.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spying.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="of each load")
    parser.add_argument("--output", type=Path, default=Path("/tmp"), help="where py-spy's raw stacks go")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mrp-", dir="/tmp"))
    try:
        write_tiny_llama(tmp / "tiny.gguf")
        conf = daemon.llama_conf(inputs.llama_server(), Settings.parallel, Settings.threads)
        with daemon.started(tmp / "home", conf, "llama.cpp") as mrunner:
            daemon.import_model(mrunner.url, MODEL, tmp / "tiny.gguf")
            client.run(mrunner.url, CHAT, chat(MODEL, 1, stream=True))
            small, streams = args.output / "profile-small.txt", args.output / "profile-streams.txt"
            with sampling(mrunner.pids[0], small):
                wrk.run(mrunner, CHAT, wrk.script(tmp, chat(MODEL, 1, stream=False)), 32, args.seconds)
            with sampling(mrunner.pids[0], streams):
                deadline = time.perf_counter() + args.seconds
                while time.perf_counter() < deadline:
                    client.run(mrunner.url, CHAT, chat(MODEL, 256, stream=True))
    finally:
        shutil.rmtree(tmp)
    for title, raw in (("small chats, wrk at 32 connections", small), ("streams of 256 tokens", streams)):
        print(f"== {title}: {raw}\n{top(raw, TOP)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
