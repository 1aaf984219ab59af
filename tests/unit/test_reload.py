"""Reloading tap.conf: every part gets the new config, or none does; restart-only keys are named."""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner import config as configuration
from mrunner.daemon.reload import Reloader
from mrunner.errors import Unprocessable


class ReloaderTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = Path(self.mktemp())
        self.write("[scheduler]\nmax_runners = 2\n")
        self.seen: list[configuration.Config] = []
        self.reloader = Reloader(self.read, self.read(), [self.seen.append])

    def write(self, text: str) -> None:
        self.path.write_text(f'home = "/tmp/mr-home"\n{text}')

    def read(self) -> configuration.Config:
        return configuration.load(self.path, environ={})

    def test_applies_at_once(self) -> None:
        self.write('[scheduler]\nmax_runners = 3\n[models]\npreload = ["smollm2"]\n')
        self.assertEqual(self.reloader.reload(), {"status": "reloaded", "restart_required": []})
        (config,) = self.seen
        self.assertEqual((config.scheduler.max_runners, config.models.preload), (3, ("ai/smollm2:latest",)))

    def test_names_what_needs_a_restart(self) -> None:
        self.write('listen = "tcp:9999"\n[scheduler]\nmax_runners = 2\nstop_grace = 1\n')
        answer = self.reloader.reload()
        self.assertEqual(answer["restart_required"], ["listen", "scheduler.stop_grace"])
        self.assertEqual(len(self.seen), 1, "the rest still applies")
        self.assertEqual(self.reloader.reload()["restart_required"], ["listen", "scheduler.stop_grace"])

    def test_an_invalid_file_changes_nothing(self) -> None:
        for text, words in [
            ("[scheduler]\nmax_runners = 'two'\n", "scheduler.max_runners: expected an integer"),
            ("[scheduler]\nkeep_alive = 'soon'\n", "scheduler.keep_alive: expected a duration"),
            ("[models]\npreload = 'smollm2'\n", "models.preload: expected a list of model names"),
            ('[models."Bad Name"]\npinned = true\n', "models.Bad Name"),
            ("[models.smollm2]\npinned = 'yes'\n", "models.smollm2.pinned: expected true or false"),
            ("[scheduler\n", "tap.conf was not reloaded"),
        ]:
            self.write(text)
            error = self.assertRaises(Unprocessable, self.reloader.reload)
            self.assertIn(words, error.message)
            self.assertIn("nothing changed", error.message)
            self.assertEqual(error.code, "invalid_config")
        self.assertEqual(self.seen, [])
