"""``twistd mrunner`` options and configuration: defaults, file, command line, environment."""

import io
import os
import signal
import socket
import sys
from pathlib import Path

import attrs
from twisted.application.service import IServiceCollection
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import capturedLogs, formatEvent
from twisted.python.usage import UsageError
from twisted.trial.unittest import SynchronousTestCase

from mrunner import config
from mrunner.daemon.startup import HomeLock, StartupError, heed_interrupt
from mrunner.tap import Options, make_service, makeService
from mrunner.values import InstallStatus


class OptionsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()
        self.patch(sys, "excepthook", sys.excepthook)  # parsing installs mrunner's one-line errors

    def options(self, *argv: str, parent: dict[str, str] | None = None) -> Options:
        options = Options()
        if parent is not None:
            options.parent = parent  # type: ignore[attr-defined]  # as twistd's ServerOptions sets it
        options.parseOptions(list(argv))
        return options

    def write(self, text: str) -> str:
        path = self.dir / "tap.conf"
        path.write_text(text)
        return str(path)

    def test_defaults(self) -> None:
        loaded = config.load(None, environ={"MRUNNER_HOME": str(self.dir)})
        self.assertEqual(loaded.listen, "tcp:12434:interface=127.0.0.1")
        self.assertEqual(loaded.scheduler.keep_alive, 300)
        self.assertEqual(loaded.default_backend, "llama.cpp")

    def test_the_documented_tap_conf_is_the_defaults(self) -> None:
        documented = config.load(Path(__file__).parents[2] / "tap.conf", environ={})
        self.assertEqual(documented.backends, {"llama.cpp": {}, "whisper.cpp": {}})
        self.assertEqual(attrs.evolve(documented, backends={}), config.load(self.write(""), environ={}))

    def test_command_line_overrides_file(self) -> None:
        path = self.write('listen = "tcp:1"\n[scheduler]\nmax_runners = 2\nkeep_alive = "30s"\n')
        options = self.options("--config", path, "--listen", "unix:/tmp/m.sock", "--home", str(self.dir))
        self.assertEqual(options.config.listen, "unix:/tmp/m.sock")
        self.assertEqual(options.config.home, self.dir)
        self.assertEqual(options.config.scheduler.max_runners, 2)
        self.assertEqual(options.config.scheduler.keep_alive, 30)

    def test_the_command_line_overrides_the_environment_which_overrides_the_file(self) -> None:
        """An C{MRUNNER_HOME} exported long ago no longer silently beats the C{--home} typed now."""
        path = self.write(f'listen = "tcp:1"\nhome = "{self.dir}/file"\n')
        environ = {"MRUNNER_LISTEN": "tcp:3", "MRUNNER_HOME": f"{self.dir}/environment"}
        loaded = config.load(path, environ=environ)
        self.assertEqual((loaded.listen, loaded.home), ("tcp:3", self.dir / "environment"))
        typed = config.load(path, {"listen": "tcp:2", "home": f"{self.dir}/typed"}, environ=environ)
        self.assertEqual((typed.listen, typed.home), ("tcp:2", self.dir / "typed"))

    def test_the_home_given_with_home_is_where_its_tap_conf_is_read(self) -> None:
        typed, exported = self.dir / "typed", self.dir / "exported"
        for home, keep_alive in ((typed, 7), (exported, 9)):
            home.mkdir()
            (home / "tap.conf").write_text(f"[scheduler]\nkeep_alive = {keep_alive}\n")
        loaded = config.load(None, {"home": str(typed)}, environ={"MRUNNER_HOME": str(exported)})
        self.assertEqual((loaded.source, loaded.scheduler.keep_alive), ((typed / "tap.conf").absolute(), 7))

    def test_bad_configs_are_one_line_start_errors(self) -> None:
        """Not UsageError: twistd prints its whole usage text before one of those."""
        for text, words in [
            ("listen = ", "tap.conf"),
            ("nonsense = 1", "nonsense"),
            ("[scheduler]\nkeep_alive = 'soon'", "keep_alive"),
            ("[scheduler]\nkeep_alive = nan", "keep_alive"),
            ("[scheduler]\nload_timeout = inf", "load_timeout"),
            ("[scheduler]\nmax_runners = 'four'", "max_runners"),
        ]:
            error = self.assertRaises(StartupError, self.options, "--config", self.write(text))
            self.assertIn(words, str(error))
            self.assertNotIsInstance(error, UsageError)
        error = self.assertRaises(StartupError, self.options, "--config", str(self.dir / "missing.conf"))
        self.assertIn("missing.conf", str(error))

    def test_twistds_default_pidfile_is_dropped(self) -> None:
        """The home's lock names the daemon's pid: no twistd.pid in the folder it starts in."""
        path = self.write(f'home = "{self.dir}"\n')
        self.assertEqual(
            self.options("--config", path, parent={"pidfile": "twistd.pid"}).parent["pidfile"], ""
        )
        chosen = {"pidfile": "/run/mrunner.pid"}
        self.assertEqual(self.options("--config", path, parent=chosen).parent["pidfile"], "/run/mrunner.pid")

    def test_a_tap_conf_present_but_not_read_is_named(self) -> None:
        """./tap.conf comes first; the home's, with its keys, is named in the log as not read."""
        home = self.dir.absolute() / "home"
        home.mkdir()
        (home / "tap.conf").write_text('[http]\napi_keys = ["sk-in-home"]\n')
        cwd = self.dir.absolute() / "checkout"
        cwd.mkdir()
        (cwd / "tap.conf").write_text("")
        self.addCleanup(os.chdir, os.getcwd())
        os.chdir(cwd)
        environ = {"MRUNNER_HOME": str(home)}
        loaded = config.load(None, environ=environ)
        self.assertEqual((loaded.source, loaded.unread), (cwd / "tap.conf", (home / "tap.conf",)))
        with capturedLogs() as events:
            service, _ = make_service(loaded, MemoryReactorClock())
        release(service)
        said = [formatEvent(e) for e in events if "NOT read" in formatEvent(e)]
        self.assertEqual(len(said), 1, said)
        self.assertIn(f"{home / 'tap.conf'} is NOT read: {cwd / 'tap.conf'} comes first", said[0])
        chosen = config.load(home / "tap.conf", environ=environ)
        self.assertEqual((chosen.http.api_keys, chosen.unread), (("sk-in-home",), ()), "chosen: no warning")

    def test_durations(self) -> None:
        self.assertEqual(
            [config.parse_duration(v) for v in (30, "30s", "5m", "1h", "250ms", -1, "0")],
            [30, 30, 300, 3600, 0.25, -1, 0],
        )
        for bad in (float("nan"), float("inf"), 10**400, "1" * 400 + "h", True, [1]):
            self.assertRaises(config.ConfigError, config.parse_duration, bad)

    def test_keep_alive_past_a_year_is_for_ever(self) -> None:
        """A keep-alive too long for the clock and the calendar (1e12 s) never reaches either."""
        self.assertEqual(
            [config.parse_keep_alive(v) for v in (300, 1e12, "300000000000s", 1e308, -5, 0)],
            [300, -1, -1, -1, -1, 0],
        )
        loaded = config.load(self.write("[scheduler]\nkeep_alive = 1e12\n"), environ={})
        self.assertEqual(loaded.scheduler.keep_alive, -1)

    def test_sizes(self) -> None:
        ram = config.physical_memory()
        self.assertEqual(
            [config.parse_size(v) for v in (0, 1024, "512MiB", "2GB", "1.5k", "auto", "50%", " 80 % ")],
            [0, 1024, 512 * 2**20, 2 * 10**9, 1500, int(ram * 0.8), int(ram * 0.5), int(ram * 0.8)],
        )
        for bad in ("lots", "0%", "150%", "-1", True):
            self.assertRaises(config.ConfigError, config.parse_size, bad, "memory_budget")

    def test_service_tree(self) -> None:
        options = self.options("--config", self.write(f'home = "{self.dir}"\n'), "--listen", "tcp:0")
        service, parts = make_service(options.config, MemoryReactorClock())
        self.assertTrue(IServiceCollection.providedBy(service))
        self.assertEqual(
            [type(child).__name__ for child in service],
            [
                "HomeLock",
                "DaemonLogFile",
                "SchedulerService",
                "LogsAPI",
                "RecordsAPI",
                "UsageService",
                "AddressFile",
                "Listener",
            ],
        )
        self.assertEqual(
            parts.scheduler.backend_statuses(), {"llama.cpp": InstallStatus(), "whisper.cpp": InstallStatus()}
        )
        release(service)


def release(service: IServiceCollection) -> None:
    """Let go of the home as a stopping daemon does, without having started the rest."""
    next(child for child in service if isinstance(child, HomeLock)).stopService()


class StartupTests(SynchronousTestCase):
    """Each start-up mistake is one line naming what to change; nothing is touched before it is found."""

    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()

    def config(self, text: str = "", **overrides: str) -> config.Config:
        path = self.dir / "tap.conf"
        path.write_text(f'home = "{self.dir}/home"\n{text}')
        return config.load(path, overrides, environ={})

    def test_the_file_read_is_logged(self) -> None:
        loaded = self.config()
        self.assertEqual(loaded.source, (self.dir / "tap.conf").absolute())
        with capturedLogs() as events:
            service, _ = make_service(loaded, MemoryReactorClock())
        release(service)
        self.assertIn(f"configuration from {loaded.source}", [formatEvent(e) for e in events])
        self.assertIsNone(config.load(None, environ={"MRUNNER_HOME": str(self.dir / "none")}).source)

    def test_commands_from_a_file_others_can_write_are_refused(self) -> None:
        text = '[backends.x]\ncommand = ["/bin/sh", "-c", "touch /tmp/owned"]\n'
        self.config(text)  # the user's own file, not writable by others: fine
        os.chmod(self.dir / "tap.conf", 0o666)
        error = self.assertRaises(config.ConfigError, self.config, text)
        self.assertIn("other users can write it", str(error))
        self.assertIn("[backends.x]", str(error))
        os.chmod(self.dir / "tap.conf", 0o644)
        self.config()  # without a command, who wrote it matters less
        if os.getuid() == 0:
            self.config(text)
            os.chown(self.dir / "tap.conf", 4321, -1)
            error = self.assertRaises(config.ConfigError, self.config, text)
            self.assertIn("owned by uid 4321", str(error))

    def test_a_listen_address_twisted_cannot_read_is_one_line(self) -> None:
        self.config()
        self.patch(sys, "excepthook", sys.excepthook)
        for bad in ("garbage:1", "tcp:http", "tcp:"):
            options = Options()
            error = self.assertRaises(
                StartupError, options.parseOptions, ["--listen", bad, "--config", str(self.dir / "tap.conf")]
            )
            self.assertIn(repr(bad), str(error))
            self.assertIn("--listen", str(error))
            self.assertNotIn("\n", str(error))

    def test_a_home_that_cannot_be_created(self) -> None:
        (self.dir / "file").write_text("")
        loaded = attrs.evolve(self.config(), home=self.dir / "file" / "home")
        error = self.assertRaises(StartupError, make_service, loaded, MemoryReactorClock())
        self.assertIn(str(self.dir / "file" / "home"), str(error))
        self.assertIn("MRUNNER_HOME", str(error))
        options = Options()
        options.config = loaded
        self.patch(sys, "excepthook", sys.excepthook)
        self.assertRaises(StartupError, makeService, options)
        printed = io.StringIO()
        self.patch(sys, "stderr", printed)
        sys.excepthook(StartupError, error, None)
        self.assertEqual(printed.getvalue(), f"mrunner: {error}\n")

    def test_a_second_daemon_on_one_home_touches_nothing(self) -> None:
        loaded = self.config()
        first, _ = make_service(loaded, MemoryReactorClock())
        staged = loaded.home / "models" / "blobs" / "sha256" / "import-1.incomplete"
        staged.write_bytes(b"an import in progress")
        error = self.assertRaises(StartupError, make_service, loaded, MemoryReactorClock())
        self.assertIn(f"pid {os.getpid()}", str(error))
        self.assertIn(str(loaded.home), str(error))
        self.assertTrue(staged.exists())
        release(first)
        second, _ = make_service(loaded, MemoryReactorClock())
        release(second)

    def test_an_address_in_use_ends_the_start(self) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            from twisted.internet import reactor

            service, _ = make_service(self.config(listen=f"tcp:{port}:interface=127.0.0.1"), reactor)
            error = self.assertRaises(StartupError, service.privilegedStartService)
            release(service)
        message = str(error)
        self.assertIn(f"cannot listen on tcp:{port}:interface=127.0.0.1: Address already in use", message)
        self.assertNotIn("\n", message)

    def test_sigint_stops_a_daemon_started_with_it_ignored(self) -> None:
        """A background job of a shell without job control starts with SIGINT ignored (issue 53 N3):
        the daemon puts Python's handler back, over which the reactor installs its own at run."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.addCleanup(signal.signal, signal.SIGINT, previous)
        heed_interrupt()
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
        handler = lambda number, frame: None  # noqa: E731  # one set on purpose (pdb's, say) is left
        signal.signal(signal.SIGINT, handler)
        heed_interrupt()
        self.assertIs(signal.getsignal(signal.SIGINT), handler)
