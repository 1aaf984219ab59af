"""``python -m bench.door``: /health and a chat beside 500 idle sockets and 5 clients trickling headers.

mrunner (``twistd``, default ``[http]`` limits) serves the tiny model on the real
``llama-server``. Each request's latency is measured first on a quiet daemon, then
with the crowd connected: 500 sockets that send nothing, and 5 that send their
headers one byte a second. Printed: median and worst of each, the ratio to quiet,
whether the worst stays within 50 ms, and how long the daemon let the tricklers
trickle (``header_timeout``, 10 s by default).
"""

from __future__ import annotations

import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2

from bench import daemon, http, inputs
from bench.__main__ import raise_fd_limit
from bench.servers import LOOPBACK
from bench.settings import chat
from mrunner.testing.tinymodel import write_tiny_llama

MODEL = "bench/door"
IDLE = 500
TRICKLERS = 5
ROUNDS = 50
WITHIN = 0.050
HEADERS = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " + b"x" * 100 + b"\r\n\r\n"


def latencies(client: httpx2.Client, url: str) -> dict[str, list[float]]:
    """Seconds per request, C{ROUNDS} of each kind, on one keep-alive connection."""
    figures: dict[str, list[float]] = {"health": [], "chat": []}
    body = chat(MODEL, max_tokens=1, stream=False)
    for _ in range(ROUNDS):
        for kind, send in (
            ("health", lambda: client.get(f"{url}/health")),
            ("chat", lambda: client.post(f"{url}/v1/chat/completions", json=body)),
        ):
            began = time.perf_counter()
            send().raise_for_status()
            figures[kind].append(time.perf_counter() - began)
    return figures


class Tricklers:
    """C{TRICKLERS} connections sending their headers a byte a second; records when each is cut off."""

    def __init__(self, port: int):
        self.began = time.perf_counter()
        self.cut: list[float] = []
        self._sockets = [socket.create_connection((LOOPBACK, port)) for _ in range(TRICKLERS)]
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        live = list(self._sockets)
        for byte in HEADERS:
            for s in list(live):
                try:
                    s.send(bytes([byte]))
                    s.setblocking(False)
                    closed = s.recv(1) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                s.setblocking(True)
                if closed:
                    self.cut.append(time.perf_counter() - self.began)
                    live.remove(s)
            if not live:
                return
            time.sleep(1)

    def wait(self, seconds: float) -> None:
        self._thread.join(seconds)
        for s in self._sockets:
            s.close()


def line(name: str, quiet: list[float], crowded: list[float]) -> str:
    q, c = statistics.median(quiet), statistics.median(crowded)
    verdict = "yes" if max(crowded) <= WITHIN else "NO"
    return (
        f"{name:<7} quiet p50 {q * 1000:6.2f} ms max {max(quiet) * 1000:6.2f} ms"
        f" | crowded p50 {c * 1000:6.2f} ms max {max(crowded) * 1000:6.2f} ms"
        f" | p50 ratio {c / q:4.2f} | max <= 50 ms: {verdict}"
    )


def main() -> int:
    raise_fd_limit()
    executable = inputs.llama_server()
    with tempfile.TemporaryDirectory(prefix="mrb-door-") as directory:
        tmp = Path(directory)
        write_tiny_llama(tmp / "tiny.gguf", seed=0)
        conf = daemon.llama_conf(executable, parallel=1, threads=1)
        with daemon.started(tmp / "home", conf, "llama.cpp") as mrunner, http.client(timeout=30.0) as client:
            daemon.import_model(mrunner.url, MODEL, tmp / "tiny.gguf")
            latencies(client, mrunner.url)  # load the runner, warm both paths
            quiet = latencies(client, mrunner.url)
            port = int(mrunner.url.rsplit(":", 1)[1])
            idle = [socket.create_connection((LOOPBACK, port)) for _ in range(IDLE)]
            tricklers = Tricklers(port)
            crowded = latencies(client, mrunner.url)
            tricklers.wait(30)
            for s in idle:
                s.close()
    print(
        f"{IDLE} idle sockets, {TRICKLERS} clients trickling headers at 1 byte/s, {ROUNDS} requests of each"
    )
    for kind in ("health", "chat"):
        print(line(kind, quiet[kind], crowded[kind]))
    cut = ", ".join(f"{seconds:.1f}" for seconds in sorted(tricklers.cut)) or "never"
    print(f"tricklers cut off after (s): {cut}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
