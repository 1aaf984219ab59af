"""The fast relay's C loop is built once per source; a machine with no compiler keeps the Twisted relay."""

from __future__ import annotations

import os
from pathlib import Path

from twisted.internet.testing import MemoryReactor
from twisted.trial.unittest import TestCase

from mrunner.proxy import cmover
from mrunner.proxy.fastrelay import FastRelay


class BuildTests(TestCase):
    def test_it_is_built_once_and_kept_by_its_sources_digest(self) -> None:
        cache = Path(self.mktemp())
        built = cmover.build(cache)
        self.assertTrue(built.name.startswith("mover-") and built.suffix == ".so")
        made = built.stat().st_mtime_ns
        self.assertEqual(cmover.build(cache, compiler="/nonexistent/cc"), built, "built again")
        self.assertEqual(built.stat().st_mtime_ns, made)
        self.assertEqual([p.name for p in cache.iterdir()], [built.name], "a partial file was left")

    def test_a_compiler_that_fails_leaves_nothing_behind(self) -> None:
        cache = Path(self.mktemp())
        with self.assertRaises(cmover.BuildFailed) as raised:
            cmover.build(cache, compiler="false")
        self.assertIn("false failed", str(raised.exception))
        self.assertEqual(list(cache.iterdir()), [])

    def test_without_a_compiler_every_stream_takes_the_twisted_relay(self) -> None:
        self.patch(os, "environ", {**os.environ, "CC": "/nonexistent/cc"})
        self.assertIsNone(cmover.fast_relay(MemoryReactor(), "fast", Path(self.mktemp())))

    def test_each_relay_named_is_the_one_made(self) -> None:
        cache = Path(self.mktemp())
        made = {name: cmover.fast_relay(MemoryReactor(), name, cache) for name in ("fast", "twisted")}
        self.assertIsInstance(made["fast"], FastRelay)
        self.assertIsNone(made["twisted"])
