"""Processes under test, each stopped by its PID when its block ends, whatever ended it.

Every process logs into the run's temporary directory and is waited for by
polling a URL, so a failed start ends the bench with the tail of that log
instead of a hang.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2

from bench import http, proc

LOOPBACK = "127.0.0.1"
#: Seconds a server may take to answer its readiness URL.
START_TIMEOUT = 120.0
#: Seconds a server has to exit after SIGTERM before SIGKILL (mrunner itself grants runners 10 s).
STOP_TIMEOUT = 30.0
#: Seconds between readiness polls: fine enough to time a start of some 50 ms.
POLL_INTERVAL = 0.002
TAIL_LINES = 15
#: The stand-in runner of the tests: streams N events, one every so often, as asked in the request.
TRICKLE_PROGRAM = Path(__file__).parents[1] / "tests" / "support" / "runner_program.py"


class ServerFailed(Exception):
    """A process under test exited or never became ready."""


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    return "\n".join(["", *(f"    {line}" for line in lines)])


class Process:
    """A child whose output goes to a log; L{stop} ends it (SIGTERM, then SIGKILL) and times that."""

    def __init__(self, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None):
        self.log = log
        with log.open("ab") as out:
            self.spawned_at = time.perf_counter()
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
        self.pid = self.popen.pid

    def stop(self) -> float:
        """Seconds from SIGTERM until the process was reaped; 0 if it had already exited."""
        if self.popen.poll() is not None:
            return 0.0
        began = time.perf_counter()
        self.popen.terminate()
        try:
            self.popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        return time.perf_counter() - began

    def wait_ready(
        self,
        url: str,
        ready: Callable[[httpx2.Response], bool] = lambda response: response.status_code == 200,
        uds: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> float:
        """Poll GET C{url} (over the UNIX socket C{uds} if given) until C{ready}; the time it first was."""
        deadline = time.perf_counter() + START_TIMEOUT
        with http.client(timeout=5.0, uds=uds) as client:
            while True:
                if self.popen.poll() is not None:
                    code = self.popen.returncode
                    raise ServerFailed(f"{self.log.stem} exited with {code}:{tail(self.log)}")
                try:
                    if ready(client.get(url, headers=headers)):
                        return time.perf_counter()
                except httpx2.TransportError:
                    pass  # not listening yet
                if time.perf_counter() > deadline:
                    raise ServerFailed(f"{url} not ready after {START_TIMEOUT:.0f}s:{tail(self.log)}")
                time.sleep(POLL_INTERVAL)


@contextmanager
def running(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> Iterator[Process]:
    """C{argv} running for the length of the block."""
    process = Process(argv, log, env)
    try:
        yield process
    finally:
        process.stop()


@dataclass(frozen=True)
class Target:
    """A path as the client sees it: the base URL, and the processes whose CPU and memory it costs."""

    url: str
    pids: tuple[int, ...]

    def cpu_seconds(self) -> float:
        return proc.cpu_seconds(self.pids)

    def rss_mb(self, key: str = "VmRSS") -> float:
        """Resident megabytes (10^6 bytes) now, or at their peak with C{key} VmHWM."""
        return sum(proc.memory_kib(pid, key) for pid in self.pids) * 1024 / 1e6


def replaced(argv: Sequence[str], flag: str, new: Sequence[str]) -> list[str]:
    """C{argv} with C{flag} and its value swapped for C{new}: another socket, port or model."""
    argv = list(argv)
    if flag not in argv:
        raise ServerFailed(f"mrunner's runner has no {flag} to replace: {' '.join(argv)}")
    at = argv.index(flag)
    argv[at : at + 2] = new
    return argv


def on_tcp(runner_argv: Sequence[str], port: int) -> list[str]:
    return replaced(runner_argv, "--host", ["--host", LOOPBACK, "--port", str(port)])


@contextmanager
def llama_server(runner_argv: Sequence[str], directory: Path, name: str) -> Iterator[Target]:
    """``llama-server`` with mrunner's runner arguments on a loopback port, the client's direct path."""
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    with running(on_tcp(runner_argv, port), directory / f"{name}.log") as process:
        process.wait_ready(f"{url}/health")
        yield Target(url, (process.pid,))


@contextmanager
def on_socket(argv: Sequence[str], path: Path, log: Path) -> Iterator[Process]:
    """A server that listens on the UNIX socket C{path}, once its C{/health} says 200."""
    with running(argv, log) as process:
        process.wait_ready("http://runner/health", uds=str(path))
        yield process


def trickle_argv(socket: str, alias: str) -> list[str]:
    """The stand-in runner on the UNIX socket C{socket}; mrunner's command backend gets placeholders."""
    return [sys.executable, str(TRICKLE_PROGRAM), "--socket", socket, "--alias", alias]


NGINX_CONF = """\
# Generated by python -m bench: nginx as the reference streaming reverse proxy.
# One worker, as mrunner serves from one reactor thread, and an access log, as
# mrunner keeps one; workers run as the bench's user, who owns the upstream's socket.
user {user};
worker_processes 1;
worker_rlimit_nofile 8192;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # llama-server closes a connection after a stream while announcing keep-alive,
    # so a request can meet a cached connection that is closing. mrunner sends such
    # a request once more; nginx resends a POST only with non_idempotent and only to
    # another server: the same socket, named twice. Idle connections are dropped
    # before llama-server's own 5 s, as mrunner's pool drops them.
    upstream runner {{
        server unix:{upstream} max_fails=0;
        server unix:{upstream} max_fails=0;
        keepalive 32;
        keepalive_timeout 4s;
    }}
    server {{
        listen {host}:{port};
        location / {{
            proxy_pass http://runner;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout non_idempotent;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
            client_max_body_size 0;
        }}
    }}
}}
"""


@contextmanager
def nginx(upstream: Path, directory: Path, prefix: Sequence[str] = ()) -> Iterator[Target]:
    """nginx on a free port, proxying to the UNIX socket C{upstream} without buffering; C{prefix}
    (C{taskset -c 1}) goes before its command line."""
    directory.mkdir()
    port = free_port()
    conf = directory / "nginx.conf"
    user = pwd.getpwuid(os.getuid()).pw_name
    conf.write_text(NGINX_CONF.format(user=user, dir=directory, host=LOOPBACK, upstream=upstream, port=port))
    argv = ["nginx", "-p", str(directory), "-c", str(conf), "-e", str(directory / "nginx-error.log")]
    with running([*prefix, *argv, "-g", "daemon off;"], directory / "nginx.log") as process:
        url = f"http://{LOOPBACK}:{port}"
        process.wait_ready(f"{url}/health")
        yield Target(url, (process.pid, *proc.children(process.pid)))
