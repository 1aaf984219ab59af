"""Issue 53, N11: the logs read as one, in the order things happened, whatever file each line is in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.defer import succeed
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel, LogPublisher
from twisted.trial.unittest import SynchronousTestCase

from mrunner.daemon.logfiles import DaemonLogFile, LogTail
from mrunner.home import Home, log_time
from mrunner.runners.process import RunnerOptions, RunnerProcess
from mrunner.values.backend import Command

#: Seconds since the epoch of the lines below: a daemon's day, its runners' lines among its own.
T = 1_790_000_000.0


def line(seconds: float, text: str) -> str:
    return f"{log_time(T + seconds)} {text}\n"


class MergeTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()

    def write(self, name: str, *lines: str) -> None:
        with (self.dir / name).open("a") as f:
            f.write("".join(lines))

    def test_in_time_order_across_sources(self) -> None:
        self.write("daemon.log", line(0, "starting runner"), line(0.5, "runner ready"), line(2, "stopping"))
        self.write(
            "ai_m-completion.log",
            line(0.1, "loading"),
            "  a line without a time\n",
            line(0.4, "listening"),
            line(1, "request"),
        )
        self.write("ai_b-completion.log", line(0.45, "other runner"))
        read = [(source, text.split(" ", 1)[1]) for source, text in LogTail(self.dir).read()]
        self.assertEqual(
            read,
            [
                ("daemon", "starting runner"),
                ("ai_m-completion", "loading"),
                ("ai_m-completion", " a line without a time"),
                ("ai_m-completion", "listening"),
                ("ai_b-completion", "other runner"),
                ("daemon", "runner ready"),
                ("ai_m-completion", "request"),
                ("daemon", "stopping"),
            ],
        )

    def test_each_read_in_order(self) -> None:
        tail = LogTail(self.dir)
        self.write("daemon.log", line(1, "b"))
        self.write("r-completion.log", line(0, "a"))
        self.assertEqual([source for source, _ in tail.read()], ["r-completion", "daemon"])
        self.write("daemon.log", line(2, "c"))
        self.write("r-completion.log", line(3, "d"))
        self.assertEqual([source for source, _ in tail.read()], ["daemon", "r-completion"])

    def test_daemon_log_lines_begin_with_the_time(self) -> None:
        """daemon.log's times are the runners' logs' (to the microsecond), so the two can be merged."""
        publisher = LogPublisher()
        log_file = DaemonLogFile(Home(self.dir), publisher)
        log_file.startService()
        publisher(
            {
                "log_format": "runner {model} ready",
                "model": "ai/m",
                "log_time": T + 0.25,
                "log_level": LogLevel.info,
            }
        )
        log_file.stopService()
        ((_, text),) = LogTail(self.dir / "logs").read()
        self.assertTrue(text.startswith(log_time(T + 0.25) + " ["), text)
        self.assertTrue(text.endswith("runner ai/m ready"), text)


class Spawned:
    """A spawned runner: its pid, and the signals it is sent."""

    pid = 4242

    def signalProcess(self, name: str) -> None:
        pass


class ProcessReactor(MemoryReactorClock):
    """A clock that spawns nothing: the protocol of each spawn is kept, to feed it output."""

    def __init__(self) -> None:
        super().__init__()
        self.protocols: list[Any] = []

    def spawnProcess(self, protocol: Any, executable: str, args: list[str], env: Any, **kw: Any) -> Any:
        transport = Spawned()
        protocol.makeConnection(transport)
        self.protocols.append(protocol)
        return transport


class RunnerLineTests(SynchronousTestCase):
    def test_each_runner_line_after_the_time_it_was_written(self) -> None:
        """llama.cpp's own times count from its start: the log's are the wall clock's, as the daemon's."""
        home = Home(Path(self.mktemp()))
        home.prepare()
        reactor = ProcessReactor()
        reactor.advance(T)
        log = home.runner_log("ai/m", "completion")
        options = RunnerOptions(load_timeout=30, stop_grace=5)
        process = RunnerProcess(
            reactor,
            lambda socket: succeed(False),
            Command("/bin/server", ()),
            home.socket("r"),
            log,
            "m",
            options,
        )
        process.start(lambda: None)
        reactor.advance(0.5)
        reactor.protocols[0].childDataReceived(2, b"0.00.012.345 I loading\nlistening\n")
        lines = log.read_text().splitlines()
        self.assertTrue(lines[0].startswith(log_time(T) + " --- mrunner: /bin/server"), lines)
        self.assertEqual(
            lines[1:], [f"{log_time(T + 0.5)} 0.00.012.345 I loading", f"{log_time(T + 0.5)} listening"]
        )
