"""The runner lifecycle allows the moves of its diagram and refuses every other."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from mrunner.scheduling.lifecycle import IllegalMove, Lifecycle
from mrunner.values import State


def at(*moves: str) -> Lifecycle:
    lifecycle = Lifecycle()
    for move in moves:
        getattr(lifecycle, move)()
    return lifecycle


class LifecycleTests(SynchronousTestCase):
    def test_the_whole_way(self) -> None:
        lifecycle = at("ready", "drain", "stop")
        self.assertEqual(lifecycle.state, State.STOPPING)
        self.assertFalse(lifecycle.running)
        self.assertEqual(lifecycle.end(), State.STOPPING)
        self.assertEqual(lifecycle.state, State.ENDED)

    def test_legal_moves(self) -> None:
        cases = [
            ((), State.LOADING),
            (("ready",), State.READY),
            (("stop",), State.STOPPING),
            (("end",), State.ENDED),
            (("ready", "stop"), State.STOPPING),
            (("ready", "end"), State.ENDED),
            (("ready", "drain", "end"), State.ENDED),
        ]
        for moves, state in cases:
            self.assertEqual(at(*moves).state, state, moves)

    def test_illegal_moves(self) -> None:
        cases = [
            ((), "drain"),
            (("ready",), "ready"),
            (("ready", "drain"), "ready"),
            (("ready", "drain"), "drain"),
            (("stop",), "ready"),
            (("stop",), "stop"),
            (("end",), "end"),
            (("end",), "ready"),
        ]
        for moves, move in cases:
            lifecycle = at(*moves)
            before = lifecycle.state
            self.assertRaises(IllegalMove, getattr(lifecycle, move))
            self.assertEqual(lifecycle.state, before, "a refused move changes nothing")
