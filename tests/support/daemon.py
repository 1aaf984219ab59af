"""mrunner for tests that run real processes: in this process on the real reactor, or as twistd."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import UNIXClientEndpoint
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from mrunner import config as configuration
from mrunner.tap import make_service
from tests.support.parsers import http_setting
from tests.support.relays import with_test_relay

# No persistent client connections: trial checks that tests leave no socket open.
http = HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))

RUNNER_PROGRAM = str(Path(__file__).with_name("runner_program.py"))


def short_home(test: SynchronousTestCase, prefix: str = "mr-") -> Path:
    """A fresh directory, removed after C{test}, with a short path: UNIX socket paths stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    test.addCleanup(shutil.rmtree, path, True)
    return path


def write_config(
    home: Path, text: str = "", runner_args: tuple[str, ...] = (), head_parser: str | None = None
) -> Path:
    """A tap.conf whose default backend, C{test}, runs tests/support/runner_program.py.

    C{head_parser}, when given, is set in C{[http]}; else the daemon's default parser reads heads.
    """
    if head_parser is not None:
        text = http_setting(text, "head_parser", head_parser)
    command = [
        sys.executable,
        RUNNER_PROGRAM,
        "--socket",
        "{socket}",
        "--alias",
        "{alias}",
        "--starts",
        str(home / "starts"),
        "--events",
        str(home / "events"),
        *runner_args,
    ]
    path = home / "tap.conf"
    path.write_text(
        f'home = "{home}"\ndefault_backend = "test"\n{text}\n'
        f"[backends.test]\ncommand = {json.dumps(command)}\n"
    )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


class InProcessDaemon:
    """The service tree of ``twistd mrunner``, in this process, on a free loopback port.

    With C{tls} (a PEM file holding a key and its certificate) it serves HTTPS at C{https://localhost};
    with C{listen}, at that endpoint instead (C{url} is then the port's, not the address's).
    C{MRUNNER_TEST_RELAY} chooses its relay (L{with_test_relay}).
    """

    def __init__(self, config_path: Path, tls: Path | None = None, listen: str | None = None):
        port = free_port()
        with_test_relay(config_path)
        self.config_path = config_path
        if listen is None:
            listen = f"tcp:{port}:interface=127.0.0.1"
        if tls is not None:
            listen = f"ssl:{port}:interface=127.0.0.1:privateKey={tls}"

        def read() -> configuration.Config:
            return configuration.load(config_path, overrides={"listen": listen}, environ={})

        self.config = read()
        self.service, parts = make_service(self.config, reactor, read)
        self.scheduler = parts.scheduler
        self.site = parts.site
        self.teams = parts.teams
        self.forwarder = parts.forwarder
        self.service.startService()
        self.url = f"https://localhost:{port}" if tls is not None else f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if not self.service.running:
            return
        await self.service.stopService()

    async def import_model(self, name: str, gguf: Path) -> None:
        """Put C{gguf} into the store as C{name} as a user would: C{POST /models/load}, keyed if need be."""
        keys = self.config.http.admin_api_keys or self.config.http.api_keys
        headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
        with gguf.open("rb") as f:
            response = await http.post(
                f"{self.url}/models/load", params={"name": name}, data=f, headers=headers
            )
            body = await response.text()
        if response.code not in (200, 201):
            raise AssertionError(f"import of {name} failed: {response.code} {body}")


def sleep(seconds: float) -> Deferred[None]:
    return deferLater(reactor, seconds, lambda: None)


async def eventually(
    condition: Callable[[], object], seconds: float = 5.0, what: Callable[[], str] | None = None
) -> None:
    """Wait until C{condition()} is true; fail the test if it is not within C{seconds}.

    The failure says what was awaited: C{what()}, else the condition's source line.
    """
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await sleep(0.01)
    if condition():
        return
    raise AssertionError(f"waited {seconds:g}s in vain for {what() if what else _source(condition)}")


def _source(condition: Callable[[], object]) -> str:
    try:
        return inspect.getsource(condition).strip()
    except (OSError, TypeError):
        return repr(condition)


class _Output(ProcessProtocol):
    def __init__(self, home: Path, name: str):
        self.home = home
        self._log = (home / name).open("ab")
        self.ended: Deferred[None] = Deferred()
        self.exit_code: int | None = None

    def childDataReceived(self, fd: int, data: bytes) -> None:
        self._log.write(data)

    def processEnded(self, reason: Any) -> None:
        self._log.close()
        self.exit_code = reason.value.exitCode
        self.ended.callback(None)


def spawn_twistd(
    config: Path, home: Path, *args: str, output_name: str = "twistd.out", default_pidfile: bool = False
) -> Any:
    """``twistd -n mrunner --config CONFIG [ARGS]`` as a child process in C{home}, its output in
    home/OUTPUT_NAME; with C{default_pidfile}, without C{--pidfile=}, as the README gives it.
    C{MRUNNER_TEST_RELAY} chooses its relay (L{with_test_relay})."""
    with_test_relay(config)
    twistd = str(Path(sys.executable).with_name("twistd"))
    output = _Output(home, output_name)
    options = [] if default_pidfile else ["--pidfile="]
    process = reactor.spawnProcess(
        output,
        twistd,
        [twistd, "-n", *options, "mrunner", "--config", str(config), *args],
        env=os.environ,
        path=str(home),
    )
    process.output = output
    return process


async def stop_twistd(process: Any) -> None:
    """SIGTERM, and wait for it to exit."""
    if process.pid is not None:
        process.signalProcess("TERM")
    await process.output.ended


@implementer(IAgentEndpointFactory)
class UNIXEndpoints:
    """Every URL goes to one UNIX socket: a daemon listening on C{unix:PATH}."""

    def __init__(self, path: str):
        self._path = path

    def endpointForURI(self, uri: Any) -> UNIXClientEndpoint:
        return UNIXClientEndpoint(reactor, self._path)


def unix_client(path: str) -> HTTPClient:
    """treq over the UNIX socket C{path}, without persistent connections (trial checks none is left)."""
    pool = HTTPConnectionPool(reactor, persistent=False)
    return HTTPClient(Agent.usingEndpointFactory(reactor, UNIXEndpoints(path), pool=pool))
