"""``[cache]`` read from tap.conf: sizes and durations in words, the folder under the home by default."""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import TestCase

from mrunner import config


class CacheConfigTests(TestCase):
    def load(self, text: str) -> config.Config:
        path = Path(self.mktemp())
        path.write_text(f'home = "/srv/mr"\n{text}')
        return config.load(path, environ={})

    def test_the_defaults(self) -> None:
        cache = self.load("").cache
        self.assertTrue(cache.enabled)
        self.assertEqual(cache.path(Path("/srv/mr")), Path("/srv/mr/cache"))
        self.assertEqual((cache.max_bytes, cache.min_tokens, cache.runner_ram), (20 * 2**30, 256, 0))

    def test_values_in_words(self) -> None:
        text = '[cache]\nfolder = "/states"\nmax_bytes = "2GiB"\nmax_age = "2h"\nruntime = 1\n'
        self.assertRaises(config.ConfigError, self.load, text)  # an unknown key
        cache = self.load(text.replace("runtime = 1\n", 'runner_ram = "512MiB"\nenabled = false\n')).cache
        self.assertEqual((cache.max_bytes, cache.max_age, cache.runner_ram), (2 * 2**30, 7200.0, 512 * 2**20))
        self.assertEqual((cache.enabled, cache.path(Path("/srv/mr"))), (False, Path("/states")))
