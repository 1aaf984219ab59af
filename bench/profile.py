"""``python -m bench.profile``: where mrunner's daemon spends its CPU on the proxy path, sampled by py-spy.

Starts mrunner with the bench's tiny model and samples the daemon while wrk
sends small chats at 32 connections and then while streams run one after
another: the two loads of scenarios 1, 2 and 6. Prints the functions with the
most samples, by their own time and with what they call. py-spy reads the
process from outside (ptrace), so the daemon runs unmodified.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import client, daemon, inputs, wrk
from bench.settings import CHAT, Settings, chat
from mrunner.tinymodel import write_tiny_llama

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="of each load")
    parser.add_argument("--output", type=Path, default=Path("profile.txt"), help="py-spy's raw stacks")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mrp-", dir="/tmp"))
    write_tiny_llama(tmp / "tiny.gguf")
    conf = daemon.llama_conf(inputs.llama_server(), Settings.parallel, Settings.threads)
    with daemon.started(tmp / "home", conf, "llama.cpp") as mrunner:
        daemon.import_model(mrunner.url, MODEL, tmp / "tiny.gguf")
        client.run(mrunner.url, CHAT, chat(MODEL, 1, stream=True))
        spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw", "--nonblocking"]
        spy += ["--pid", str(mrunner.pids[0]), "--output", str(args.output)]
        with subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as sampling:
            try:
                time.sleep(1)  # py-spy attaches
                lua = wrk.script(tmp, chat(MODEL, 1, stream=False))
                wrk.run(mrunner, CHAT, lua, 32, args.seconds)
                deadline = time.perf_counter() + args.seconds
                while time.perf_counter() < deadline:
                    client.run(mrunner.url, CHAT, chat(MODEL, 256, stream=True))
            finally:
                sampling.send_signal(2)  # py-spy writes its file on SIGINT
                sampling.wait(30)
    print(top(args.output, TOP))
    return 0


if __name__ == "__main__":
    sys.exit(main())
