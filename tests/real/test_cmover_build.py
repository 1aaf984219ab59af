"""The fast relay's C loop is built once per source, and a machine with no compiler keeps the Python loop."""

from __future__ import annotations

import os
from pathlib import Path

from twisted.internet.testing import MemoryReactor
from twisted.trial.unittest import TestCase

from mrunner.runners import cmover


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

    def test_without_a_compiler_the_fast_relay_keeps_its_python_loop(self) -> None:
        self.patch(os, "environ", {**os.environ, "CC": "/nonexistent/cc"})
        relay = cmover.fast_relay(MemoryReactor(), "fast", Path(self.mktemp()))
        assert relay is not None
        self.assertEqual(relay.loop, "python")

    def test_each_relay_named_is_the_one_made(self) -> None:
        cache = Path(self.mktemp())
        loops = {
            name: cmover.fast_relay(MemoryReactor(), name, cache) for name in ("fast", "python", "twisted")
        }
        self.assertEqual(
            {name: r and r.loop for name, r in loops.items()},
            {"fast": "c", "python": "python", "twisted": None},
        )
