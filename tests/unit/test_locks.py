"""KeyedLocks under a burst: each holder in turn, and the key's entry gone with the last."""

from __future__ import annotations

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.trial.unittest import TestCase

from mrunner.store.locks import KeyedLocks


class KeyedLocksTests(TestCase):
    def _burst(self, count: int) -> None:
        locks = KeyedLocks()
        order: list[int] = []
        gates = [Deferred[None]() for _ in range(count)]

        async def hold(index: int) -> None:
            async with locks.holding("sha256:a"):
                order.append(index)
                if index == 0:
                    await gates[0]  # the first holds while the others queue; they pass at once

        done = [ensureDeferred(hold(index)) for index in range(count)]
        self.assertEqual(order, [0])
        gates[0].callback(None)  # its release runs every waiter's whole block before it leaves
        for each in done:
            self.successResultOf(each)
        self.assertEqual(order, list(range(count)))
        self.assertEqual(locks._kept, {})

    def test_four_at_once(self) -> None:
        self._burst(4)

    def test_sixteen_at_once(self) -> None:
        self._burst(16)

    def test_keys_apart(self) -> None:
        locks = KeyedLocks()
        held = Deferred[None]()

        async def hold(key: str, wait: Deferred[None] | None) -> None:
            async with locks.holding(key):
                if wait is not None:
                    await wait

        first = ensureDeferred(hold("a", held))
        self.successResultOf(ensureDeferred(hold("b", None)))  # another key does not wait
        self.assertNoResult(first)
        held.callback(None)
        self.successResultOf(first)
        self.assertEqual(locks._kept, {})
