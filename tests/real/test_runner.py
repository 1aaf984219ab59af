"""A runner's life around a real L{RunnerProcess} on a fake process reactor: ready, load timeout, exits,
TERM then KILL, logs."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from mrunner.backends.childprocess import SETPRIV, SETSID
from mrunner.errors import RunnerFailed
from mrunner.home import Home
from mrunner.interfaces import IRunnerProcess
from mrunner.runners.lifecycle import Stage
from mrunner.runners.process import RunnerOptions, RunnerProcess, runner_environment
from mrunner.runners.runner import POLL_FIRST, Runner
from mrunner.scheduling.roster import Roster
from mrunner.values.backend import Command
from tests.support.fakes import RecordingEvents
from tests.support.loading import request


@attrs.define
class FakeTransport:
    """A spawned process: records signals; refuses them once it has ended, as Twisted's does."""

    pid: int
    signals: list[str] = attrs.field(factory=list)
    ended: bool = False

    def signalProcess(self, name: str) -> None:
        if self.ended:
            raise ProcessExitedAlready()
        self.signals.append(name)


class ProcessReactor(MemoryReactorClock):
    """A Clock that records spawnProcess calls, like Twisted's own DummyProcessReactor."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[tuple[Any, str, list[str], dict[str, str]]] = []
        self.transports: list[FakeTransport] = []

    def spawnProcess(
        self, protocol: Any, executable: str, args: list[str], env: dict[str, str], **kw: Any
    ) -> Any:
        transport = FakeTransport(pid=4000 + len(self.transports))
        protocol.makeConnection(transport)
        self.spawned.append((protocol, executable, args, env))
        self.transports.append(transport)
        return transport


OPTIONS = RunnerOptions(load_timeout=30, stop_grace=5, log_max_bytes=200, log_keep=2)


@attrs.define
class Keeper:
    """The loader's side: the errors of failed starts."""

    failures: list[RunnerFailed] = attrs.field(factory=list)

    def opened(self, runner: Runner) -> None:
        pass

    def failed(self, runner: Runner, reason: Failure) -> None:
        self.failures.append(reason.value)

    def replan(self) -> None:
        pass


class RunnerProcessTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = ProcessReactor()
        self.home = Home(Path(self.mktemp()))
        self.home.prepare()
        self.healthy = False
        self.probes: list[str] = []
        self.socket = self.home.socket("r1")
        environ = {"PATH": "/usr/bin", "HOME": "/home/u", "SECRET_TOKEN": "x", "LC_ALL": "C"}
        self.events = RecordingEvents()
        self.keeper = Keeper()
        self.roster = Roster(self.reactor, self.events, self.keeper)
        self.process = RunnerProcess(
            self.reactor,
            self.probe,
            Command("/opt/llama-server", ("--port", "0"), env={"EXTRA": "1"}),
            self.socket,
            self.home.runner_log("ai/m:latest", "completion"),
            "ai/m (completion)",
            OPTIONS,
            environ,
        )

    def probe(self, socket: str) -> Deferred[bool]:
        self.probes.append(socket)
        return succeed(self.healthy)

    def start(self) -> FakeTransport:
        self.runner = self.roster.add(request(), self.process)
        return self.reactor.transports[-1]

    def error(self) -> str:
        """The one failed start's message."""
        [error] = self.keeper.failures
        return error.message

    def output(self, data: bytes) -> None:
        self.reactor.spawned[-1][0].childDataReceived(2, data)

    def end(self, transport: FakeTransport, reason: Exception) -> None:
        transport.ended = True
        self.reactor.spawned[-1][0].processEnded(Failure(reason))

    def test_provides_the_interface(self) -> None:
        self.assertTrue(verifyObject(IRunnerProcess, self.process))

    def test_a_late_health_answer_changes_nothing(self) -> None:
        answers: list[Deferred[bool]] = []

        def slow_probe(socket: str) -> Deferred[bool]:
            answers.append(Deferred())
            return answers[-1]

        self.process._probe = slow_probe
        transport = self.start()
        self.runner.stop()
        answers[0].callback(True)
        self.assertIs(self.runner.stage, Stage.STOPPING)
        self.end(transport, ProcessTerminated(signal=15))
        self.assertIs(self.runner.stage, Stage.ENDED)
        self.assertEqual(self.events.seen, [("exited", "stopped")])

    def test_the_constructor_starts_nothing(self) -> None:
        self.assertEqual(self.reactor.spawned, [])
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        self.assertFalse(self.home.runner_log("ai/m:latest", "completion").exists())

    def test_ready_when_healthy(self) -> None:
        transport = self.start()
        _, executable, args, env = self.reactor.spawned[0]
        self.assertEqual(executable, args[0])
        own_session = [SETSID, "--"] if SETSID else []
        death_signal = [SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV else []
        self.assertEqual(list(args), [*own_session, *death_signal, "/opt/llama-server", "--port", "0"])
        self.assertEqual(env, {"PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C", "EXTRA": "1"})
        pid_file = Home.pid_file(self.socket)
        self.assertEqual(pid_file.read_text(), str(transport.pid))
        self.assertEqual(stat.S_IMODE(pid_file.stat().st_mode), 0o600)
        self.reactor.advance(POLL_FIRST)
        self.assertIs(self.runner.stage, Stage.LOADING)
        self.healthy = True
        self.reactor.advance(1)
        self.assertIs(self.runner.stage, Stage.READY)
        self.assertEqual(self.reactor.getDelayedCalls(), [], "no poll and no deadline left")
        self.assertEqual(set(self.probes), {self.socket})
        self.assertEqual(len(self.probes), 3, "at once, then after 0.02s and 0.03s more")

    def test_output_makes_it_look_sooner(self) -> None:
        self.start()
        self.reactor.advance(POLL_FIRST)
        self.reactor.advance(POLL_FIRST * 1.5)  # the back-off has grown
        self.healthy = True
        self.output(b"server is listening\n")
        self.reactor.advance(POLL_FIRST)
        self.assertIs(self.runner.stage, Stage.READY)

    def test_load_timeout(self) -> None:
        transport = self.start()
        self.output(b"loading tensors\n")
        self.reactor.advance(OPTIONS.load_timeout)
        self.assertIn("was not ready after 30s", self.error())
        self.assertIn("loading tensors", self.error())
        self.assertEqual(transport.signals, ["TERM"])
        self.assertNoResult(self.process.ended)
        self.assertIs(self.runner.stage, Stage.FAILING)
        self.end(transport, ProcessTerminated(signal=15))
        self.successResultOf(self.process.ended)
        self.assertIs(self.runner.stage, Stage.ENDED)

    def test_exit_while_loading(self) -> None:
        transport = self.start()
        self.output(b"error: bad magic\n")
        self.end(transport, ProcessTerminated(exitCode=1))
        self.assertEqual(
            self.error(),
            "runner ai/m (completion) exited with code 1 before it was ready;"
            " its last output:\nerror: bad magic",
        )
        self.successResultOf(self.process.ended)
        self.assertFalse(Home.pid_file(self.socket).exists())
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        self.assertEqual(transport.signals, [])

    def test_exit_while_serving(self) -> None:
        transport = self.start()
        self.healthy = True
        self.reactor.advance(POLL_FIRST)
        self.assertIs(self.runner.stage, Stage.READY)
        Path(self.socket).touch()
        self.end(transport, ProcessDone(0))
        self.successResultOf(self.process.ended)
        self.assertFalse(Path(self.socket).exists())
        self.assertIsNone(self.process.rss())
        self.assertEqual(self.events.seen[-2:], [("evicted", "crash"), ("exited", "crashed")])
        self.process.terminate()
        self.process.kill()
        self.assertEqual(transport.signals, [], "nothing to signal once it has ended")

    def test_term_ignored_then_kill(self) -> None:
        transport = self.start()
        self.healthy = True
        self.reactor.advance(POLL_FIRST)
        self.runner.stop()
        self.process.terminate()
        self.assertEqual(transport.signals, ["TERM"], "stopping twice signals once")
        self.reactor.advance(OPTIONS.stop_grace - 0.1)
        self.assertEqual(transport.signals, ["TERM"])
        self.reactor.advance(0.1)
        self.assertEqual(transport.signals, ["TERM", "KILL"])
        self.end(transport, ProcessTerminated(signal=9))
        self.successResultOf(self.process.ended)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stop_while_loading_is_no_failure(self) -> None:
        transport = self.start()
        self.runner.stop()
        self.assertEqual(self.keeper.failures, [])
        self.end(transport, ProcessTerminated(signal=15))
        self.successResultOf(self.process.ended)
        self.assertEqual(self.events.seen, [("exited", "stopped")])
        self.assertEqual(self.reactor.getDelayedCalls(), [], "the KILL escalation is cancelled")

    def test_log_is_private_and_rotated(self) -> None:
        transport = self.start()
        for i in range(40):
            self.output(b"line %d of the runner's output\n" % i)
        self.end(transport, ProcessDone(0))
        self.assertIn("exited with code 0 before it was ready", self.error())
        log = self.home.runner_log("ai/m:latest", "completion")
        self.assertEqual(stat.S_IMODE(log.stat().st_mode), 0o600)
        self.assertLessEqual(log.stat().st_size, OPTIONS.log_max_bytes + 100)
        self.assertIn("runner ended: exited with code 0", log.read_text())
        rotated = sorted(p.name for p in log.parent.iterdir() if p.name.startswith(log.name + "."))
        self.assertEqual(rotated, [log.name + ".1", log.name + ".2"], "the last two are kept")


class EnvironmentTests(SynchronousTestCase):
    def test_minimal(self) -> None:
        environ = {
            "PATH": "/bin",
            "LD_LIBRARY_PATH": "/opt/lib",
            "CUDA_VISIBLE_DEVICES": "0",
            "MRUNNER_API_KEY": "secret",
            "AWS_SECRET_ACCESS_KEY": "secret",
        }
        self.assertEqual(
            runner_environment(None, environ),
            {"PATH": "/bin", "LD_LIBRARY_PATH": "/opt/lib", "CUDA_VISIBLE_DEVICES": "0"},
        )
        self.assertEqual(runner_environment({"PATH": "/x"}, environ)["PATH"], "/x", "the backend's own wins")


class HomeTests(SynchronousTestCase):
    def test_owner_only(self) -> None:
        home = Home(Path(self.mktemp()) / "home")
        home.prepare()
        for directory in (home.root, home.run, home.logs):
            self.assertEqual(stat.S_IMODE(directory.stat().st_mode), 0o700, directory)
        os.chmod(home.run, 0o755)
        home.prepare()
        self.assertEqual(stat.S_IMODE(home.run.stat().st_mode), 0o700, "tightened again at start")


class FailedSpawnTests(SynchronousTestCase):
    def test_a_spawn_that_fails_leaves_no_log_open(self) -> None:
        class Refusing(ProcessReactor):
            def spawnProcess(self, *args: Any, **kw: Any) -> Any:
                raise OSError(2, "No such file or directory")

        home = Home(Path(self.mktemp()))
        home.prepare()
        runner = RunnerProcess(
            Refusing(),
            lambda s: succeed(False),
            Command("/nope", ()),
            home.socket("r"),
            home.runner_log("m", "c"),
            "m",
            OPTIONS,
        )
        self.assertRaises(OSError, runner.start, lambda: None)
        self.assertIsNone(runner._output)
        self.assertEqual(runner.rss(), None)
