"""Keep-alives and timestamps that a clock and a calendar can hold."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from mrunner.values import durations


class DurationTests(SynchronousTestCase):
    def test_keep_alive(self) -> None:
        year = durations.LONGEST_KEEP_ALIVE
        self.assertEqual(
            [durations.keep_alive(s) for s in (0, 300, year, year + 1, 1e308, -0.5)],
            [0, 300, year, -1, -1, -1],
        )
        for bad in (float("nan"), float("inf"), float("-inf")):
            self.assertRaises(ValueError, durations.keep_alive, bad)

    def test_timestamp_never_raises(self) -> None:
        self.assertEqual(durations.timestamp(300), "1970-01-01T00:05:00+00:00")
        for seconds in (None, 1e12 * 1e6, 1e308, float("nan"), float("inf"), -1e308):
            self.assertIsNone(durations.timestamp(seconds), seconds)
