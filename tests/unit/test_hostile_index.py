"""A damaged or missing ``models/index.json`` at start (issue 35, A22): rebuilt from the manifests."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from mrunner.store.errors import StoreCorrupt
from mrunner.store.local import ModelStore
from tests.support.store_cases import StoreTestCase

DAMAGES = ("empty", "half written", "random", "[ x 100,000", "a directory", "not an index", "tags not a list")


def damage(path: Path, how: str) -> None:
    whole = path.read_bytes()
    if how == "a directory":
        path.unlink()
        path.mkdir()
        (path / "inside").write_text("x")
        return
    path.write_bytes(
        {
            "empty": b"",
            "half written": whole[: len(whole) // 2],
            "random": os.urandom(4096),
            "[ x 100,000": b"[" * 100_000,
            "not an index": json.dumps({"models": {"ai/x": "latest"}}).encode(),
            "tags not a list": json.dumps({"models": {"sha256:" + "a" * 64: 7}}).encode(),
        }[how]
    )


class RebuildTests(StoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.first = self.import_model("x")
        self.store.tag("x", "ai/also:1")
        self.second = self.import_model("y", seed=1)
        self.index = self.home / "models" / "index.json"
        self.warnings: list[str] = []

        def observe(event: dict[str, object]) -> None:
            if event.get("log_level") == LogLevel.warn:
                self.warnings.append(formatEvent(event))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)

    def restarted(self) -> ModelStore:
        store = ModelStore(self.home, self.clock)
        self.assertEqual(sorted(m.id for m in store.list()), sorted([self.first.id, self.second.id]))
        self.assertEqual([m.tags for m in store.list()], [(), ()], "the index alone held the tags")
        (warning,) = self.warnings
        self.assertIn("rebuilt from the 2 model manifests in the store", warning)
        self.assertIn("`mrunner tag ID NAME`", warning)
        again = ModelStore(self.home, self.clock)
        self.assertEqual(len(again.list()), 2)
        self.assertEqual(len(self.warnings), 1, "the rebuilt index is saved: the next start says nothing")
        return store

    def test_each_damage_is_moved_aside_and_rebuilt(self) -> None:
        for how in DAMAGES:
            with self.subTest(how):
                self.warnings.clear()
                damage(self.index, how)
                store = self.restarted()
                (aside,) = self.index.parent.glob("index.json.damaged-*")
                self.assertIn(f"(moved to {aside})", self.warnings[0])
                self.assertTrue(aside.exists(), "kept for a person to look at")
                shutil.rmtree(aside) if aside.is_dir() else aside.unlink()
                store.tag(self.first.id, "ai/x")  # as the warning says: named again, and usable
                self.assertEqual(self.successResultOf(store.ready(store.resolve("x"))).id, self.first.id)

    def test_a_removed_index(self) -> None:
        self.index.unlink()
        self.restarted()
        self.assertIn("index.json is missing;", self.warnings[0])

    def test_the_blobs_are_not_collected(self) -> None:
        self.index.unlink()
        store = self.restarted()
        files = self.stored_files()
        store.collect()
        self.assertEqual(self.stored_files(), files)

    def test_blobs_that_are_not_manifests_are_passed_over(self) -> None:
        """A blob of nested brackets (a license, say) is not a manifest, nor a reason to stop."""
        self.store.blobs.put(b"[" * 100_000)
        self.index.unlink()
        self.restarted()

    def test_a_fresh_home_says_nothing(self) -> None:
        home = Path(self.mktemp())
        self.assertEqual(ModelStore(home, self.clock).list(), [])
        self.assertEqual(self.warnings, [])
        self.assertFalse((home / "models" / "index.json").exists())

    def test_an_index_that_cannot_be_moved_aside_is_one_line(self) -> None:
        self.index.write_text("{")
        models = self.index.parent
        os.chmod(models, 0o500)
        self.addCleanup(os.chmod, models, 0o700)
        if os.access(models, os.W_OK):
            self.skipTest("root writes where the mode says no")
        error = self.assertRaises(StoreCorrupt, ModelStore, self.home, self.clock)
        self.assertIn("cannot be moved aside", error.message)
        self.assertIn("move it away", error.message)
