"""``python -m bench.router``: what vLLM's router (``vllm-router``) adds in front of an mrunner node.

One node with the bench's tiny model, and ``vllm-router --enable-igw`` with
that node registered for the model (as tests/real/test_cluster_real.py runs
it). Small chats (one token) go one at a time, on one keep-alive connection
each way, alternating between the node itself and the router in rounds so
that the machine's load falls on both alike. Prints the median of each and
their ratio: the router's added latency as a share of a direct request.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import daemon, http, inputs
from bench.servers import LOOPBACK, free_port, running
from bench.settings import CHAT, Settings, chat
from mrunner.testing.tinymodel import write_tiny_llama

MODEL = "bench/tiny"


def timed(targets: list[str], rounds: int, per_round: int) -> dict[str, list[float]]:
    """Seconds each chat took at each of C{targets} (base URLs), taking turns by round."""
    times: dict[str, list[float]] = {target: [] for target in targets}
    body = chat(MODEL, 1, stream=False)
    with http.client(timeout=30.0) as client:
        for _ in range(rounds):
            for target, seconds in times.items():
                for _ in range(per_round):
                    began = time.perf_counter()
                    client.post(target + CHAT, json=body).raise_for_status()
                    seconds.append(time.perf_counter() - began)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.router", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=30, help="chats to each target per round")
    args = parser.parse_args(argv)
    router_program = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which(
        "vllm-router"
    )
    if router_program is None:
        print("vllm-router is not installed: pip install vllm-router (in the test extras)")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="mrr-", dir="/tmp"))
    try:
        write_tiny_llama(tmp / "tiny.gguf")
        conf = daemon.llama_conf(inputs.llama_server(), Settings.parallel, Settings.threads)
        port = free_port()
        router_argv = [router_program, "--enable-igw", "--host", LOOPBACK, "--port", str(port)]
        router_argv += ["--policy", "round_robin", "--log-level", "warning"]
        with (
            daemon.started(tmp / "home", conf, "llama.cpp") as node,
            running(router_argv, tmp / "router.log") as router,
        ):
            router_url = f"http://{LOOPBACK}:{port}"
            router.wait_ready(router_url + "/workers")
            daemon.import_model(node.url, MODEL, tmp / "tiny.gguf")
            with http.client(timeout=10.0) as client:
                added = client.post(router_url + "/workers", json={"url": node.url, "model_id": MODEL})
                added.raise_for_status()
            timed([node.url, router_url], 1, 10)  # warm: the runner loaded, connections open
            times = timed([node.url, router_url], args.rounds, args.per_round)
    finally:
        shutil.rmtree(tmp)
    direct, routed = (statistics.median(seconds) * 1000 for seconds in times.values())
    count = args.rounds * args.per_round
    print(
        f"one-token chats, median of {count} each: direct {direct:.2f} ms, through vllm-router"
        f" {routed:.2f} ms: {routed / direct:.2f} times, {routed - direct:+.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
