"""``twistd mrunner`` options and configuration: defaults, file, command line, environment."""

from pathlib import Path

import attrs
from twisted.application.service import IServiceCollection
from twisted.internet.testing import MemoryReactorClock
from twisted.python.usage import UsageError
from twisted.trial.unittest import SynchronousTestCase

from mrunner import config
from mrunner.scheduling.installer import InstallStatus
from mrunner.tap import Options, make_service


class OptionsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()

    def options(self, *argv: str) -> Options:
        options = Options()
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
        documented = config.load(Path(__file__).parent.parent / "tap.conf", environ={})
        self.assertEqual(documented.backends, {"llama.cpp": {}})
        self.assertEqual(attrs.evolve(documented, backends={}), config.load(self.write(""), environ={}))

    def test_command_line_overrides_file(self) -> None:
        path = self.write('listen = "tcp:1"\n[scheduler]\nmax_runners = 2\nkeep_alive = "30s"\n')
        options = self.options("--config", path, "--listen", "unix:/tmp/m.sock", "--home", str(self.dir))
        self.assertEqual(options.config.listen, "unix:/tmp/m.sock")
        self.assertEqual(options.config.home, self.dir)
        self.assertEqual(options.config.scheduler.max_runners, 2)
        self.assertEqual(options.config.scheduler.keep_alive, 30)

    def test_environment_overrides_both(self) -> None:
        path = self.write('listen = "tcp:1"\n')
        loaded = config.load(path, {"listen": "tcp:2"}, environ={"MRUNNER_LISTEN": "tcp:3"})
        self.assertEqual(loaded.listen, "tcp:3")

    def test_bad_configs_are_usage_errors(self) -> None:
        for text, words in [
            ("listen = ", "tap.conf"),
            ("nonsense = 1", "nonsense"),
            ("[scheduler]\nkeep_alive = 'soon'", "keep_alive"),
            ("[scheduler]\nmax_runners = 'four'", "max_runners"),
        ]:
            error = self.assertRaises(UsageError, self.options, "--config", self.write(text))
            self.assertIn(words, str(error))
        error = self.assertRaises(UsageError, self.options, "--config", str(self.dir / "missing.conf"))
        self.assertIn("missing.conf", str(error))

    def test_durations(self) -> None:
        self.assertEqual(
            [config.parse_duration(v) for v in (30, "30s", "5m", "1h", "250ms", -1, "0")],
            [30, 30, 300, 3600, 0.25, -1, 0],
        )

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
            ["DaemonLogFile", "SchedulerService", "LogsAPI", "StreamServerEndpointService"],
        )
        self.assertEqual(parts.scheduler.backend_statuses(), {"llama.cpp": InstallStatus()})
