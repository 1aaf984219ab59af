"""The daemon's garbage collector settings: start-up objects frozen, young ones collected rarer."""

import gc

from twisted.trial.unittest import SynchronousTestCase

from mrunner.daemon import collector


class SettleTests(SynchronousTestCase):
    def setUp(self) -> None:
        threshold = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *threshold)
        self.addCleanup(gc.unfreeze)

    def test_young_generation_rarer(self) -> None:
        """The youngest generation waits for L{collector.YOUNG} allocations; the older ones keep theirs."""
        _, middle, old = gc.get_threshold()
        collector.settle()
        self.assertEqual(gc.get_threshold(), (collector.YOUNG, middle, old))

    def test_freezes(self) -> None:
        """What exists at start is moved out of every collection."""
        kept = [object() for _ in range(3)], {}
        collector.settle()
        self.assertGreater(gc.get_freeze_count(), 0)
        self.assertFalse(any(found is kept for found in gc.get_objects()))
