"""preStop hook: drain this node, then wait until it serves nothing, so a rolling update loses no request.

POST /engines/_drain makes the node refuse new requests (503 with Retry-After, which routers retry
on another node) and report not ready; the requests in flight, streams too, run to their end.
The hook returns once /metrics counts none running or waiting; the kubelet then sends SIGTERM,
which drains too, within [http] drain_timeout. terminationGracePeriodSeconds bounds the whole.
"""

import os
import sys
import time
import urllib.request

QUEUE = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def call(method: str, path: str) -> bytes:
    """C{path} on this node's listen address, with its key."""
    port = os.environ["MRUNNER_LISTEN"].split(":")[1]
    request = urllib.request.Request(
        f"http://{os.environ['POD_IP']}:{port}{path}",
        method=method,
        headers={"Authorization": f"Bearer {os.environ.get('MRUNNER_API_KEY', '')}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def busy(metrics: str) -> float:
    """Requests running or waiting, summed over models, from the Prometheus text."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(QUEUE))


def main() -> None:
    try:
        call("POST", "/engines/_drain")
        while busy(call("GET", "/metrics").decode()):
            time.sleep(1)
    except OSError as e:  # HTTP errors too: the SIGTERM that follows drains the node anyway
        sys.exit(f"drain: {e}")


if __name__ == "__main__":
    main()
