"""The access log: lines of a second's requests logged as one event."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase

from mrunner.daemon.logfiles import AccessLog


class AccessLogTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.patch(AccessLog, "log", Logger(namespace="access", observer=self.events.append))
        self.clock = Clock()
        self.access = AccessLog(self.clock)

    def lines(self) -> list[str]:
        return [event["lines"] for event in self.events]

    def test_a_seconds_lines_are_one_event(self) -> None:
        self.access.write('a - - "GET / HTTP/1.1" 200\n')
        self.access.write('b - - "GET / HTTP/1.1" 200\n')
        self.assertEqual(self.lines(), [])
        self.clock.advance(1)
        self.assertEqual(self.lines(), ['a - - "GET / HTTP/1.1" 200\nb - - "GET / HTTP/1.1" 200'])
        self.clock.advance(5)
        self.assertEqual(len(self.events), 1, "nothing more to log")
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_close_logs_what_is_left_at_once(self) -> None:
        self.access.write("c\n")
        self.access.close()
        self.assertEqual(self.lines(), ["c"])
        self.assertEqual(self.clock.getDelayedCalls(), [])
