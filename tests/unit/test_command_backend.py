"""Backends defined by a command line in the config."""

from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends.command import CommandBackend
from mrunner.values.backend import EMBEDDING, RunnerSettings
from tests.support.fakes import model


class CommandBackendTests(SynchronousTestCase):
    def test_placeholders(self) -> None:
        backend = CommandBackend(
            "custom", ["python3", "-m", "srv", "--m={model}", "{socket}", "{mode}", "{parallel}"]
        )
        command = backend.command(
            model(), EMBEDDING, "/run/a.sock", RunnerSettings(parallel=3, flags=("-x",))
        )
        self.assertTrue(command.executable.endswith("python3"))
        self.assertEqual(command.args, ("-m", "srv", "--m=/m.gguf", "/run/a.sock", "embedding", "3", "-x"))

    def test_install_finds_the_program(self) -> None:
        self.assertIn("python3", self.successResultOf(CommandBackend("c", ["python3"]).install(print)))
        failure = self.failureResultOf(CommandBackend("c", ["no-such-program-here"]).install(print))
        self.assertIn("no-such-program-here", failure.getErrorMessage())

    def test_bad_config(self) -> None:
        self.assertRaises(ValueError, CommandBackend, "c", [])
        self.assertRaises(ValueError, CommandBackend, "c", "python3 x")
