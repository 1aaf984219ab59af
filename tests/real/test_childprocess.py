"""A real child's output read every so often (L{Child.read_every}): nothing lost, fewer reads."""

from __future__ import annotations

import sys

from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from mrunner.backends import childprocess

# Says hello, waits to be read every so often, then writes 200 lines a write each, then bye.
TALKER = """
import os, sys, time
os.write(1, b"hello\\n")
time.sleep(0.3)
for n in range(200):
    os.write(1 if n % 2 else 2, b"line %d\\n" % n)
time.sleep(0.2)
os.write(1, b"bye\\n")
time.sleep(float(sys.argv[1]))
"""


class ReadEveryTests(TestCase):
    def spawn(self, linger: float) -> tuple[childprocess.Child, list[list[str]]]:
        reads: list[list[str]] = []
        child = childprocess.spawn(
            reactor, [sys.executable, "-c", TALKER, str(linger)], on_lines=reads.append
        )
        self.addCleanup(child.kill, 0)
        return child, reads

    async def hello(self, reads: list[list[str]]) -> None:
        while not reads:
            await deferLater(reactor, 0.01)

    async def test_every_line_in_fewer_reads(self) -> None:
        child, reads = self.spawn(linger=0)
        await self.hello(reads)
        child.read_every(0.05)
        exit = await child.ended()
        lines = [line for read in reads for line in read]
        self.assertEqual(lines[0], "hello")
        self.assertEqual(sorted(lines[1:-1]), sorted(f"line {n}" for n in range(200)))
        self.assertEqual(lines[-1], "bye")
        self.assertLess(len(reads), 20, "200 lines written one by one came in a few reads")
        self.assertEqual((exit.code, exit.tail[-1]), (0, "bye"))

    async def test_a_kill_ends_the_wait_for_the_next_read(self) -> None:
        child, reads = self.spawn(linger=60)
        await self.hello(reads)
        child.read_every(3600.0)  # the next read would be an hour away
        child.kill(grace=60)
        exit = await child.ended()  # the pipes' end is read at once, and the exit seen
        self.assertIsNotNone(exit.signal)
        self.assertEqual(exit.tail[0], "hello")
