"""Scenario 13's shapes and rows (bench/realstreams.py): each shape measured once, and the sweep's
row the size furthest from each goal, so a miss at any size shows."""

from __future__ import annotations

import dataclasses

from twisted.trial.unittest import SynchronousTestCase

from bench import fastrunner, realstreams
from bench.realstreams import END, RATE, Shape
from bench.settings import Settings

SETTINGS = dataclasses.replace(Settings(), real_streams="1:256,4:192", real_sizes="160,224,32")


def figures(rate: float, end: float) -> dict[str, float]:
    return {RATE: rate, END: end}


class RealStreamsTests(SynchronousTestCase):
    def test_a_shape_in_the_counts_and_the_sweep_is_measured_once(self) -> None:
        self.assertEqual(realstreams.shapes(SETTINGS), [(1, 256), (4, 192), (4, 160), (4, 224)])

    def test_the_sweep_rows_are_its_worst_sizes(self) -> None:
        direct: dict[Shape, dict[str, float]] = {
            shape: figures(1000, 1.0) for shape in realstreams.shapes(SETTINGS)
        }
        relay = dict(direct)
        relay[(4, 160)] = figures(900, 1.2)  # the lowest rate, its end within the goal
        relay[(4, 224)] = figures(960, 2.1)  # past 1.5 x 1.0 + 0.5 s
        results = {"idle": {"direct": direct, **dict.fromkeys(fastrunner.RELAYS, direct), "fast": relay}}
        rows = [row for row in realstreams.rows(results, SETTINGS) if "relay fast" in row.scenario]
        by_target = {row.target: row for row in rows}
        rate = by_target["tokens/s, 4 x 160-224, worst (160)"]
        end = by_target["slowest end s, 4 x 160-224, worst (224)"]
        self.assertEqual((rate.values["mrunner"], rate.met()), (900, False))
        self.assertEqual((end.values["mrunner"], end.met()), (2.1, False))
        self.assertEqual(set(rate.details), {"4 x 160", "4 x 192", "4 x 224"})
        self.assertTrue(by_target["slowest end s, 1 x 256"].met())
