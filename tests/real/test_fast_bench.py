"""Scenario 12's C programs (bench/fast/): they build with the system compiler, and the load counts every
event the stand-in runner streams, direct over its UNIX socket (counts only: the machine is shared)."""

from __future__ import annotations

import dataclasses
import subprocess

from twisted.trial.unittest import SynchronousTestCase

from bench import fastrunner, servers
from bench.settings import Settings
from tests.support.daemon import short_home


class FastRunnerTests(SynchronousTestCase):
    def test_the_load_sees_every_event_the_runner_streams(self) -> None:
        tmp = short_home(self)
        runner, load = fastrunner.build(tmp)
        socket = tmp / "fast.sock"
        with servers.on_socket([str(runner), str(socket), "40", "0.02"], socket, tmp / "runner.log"):
            settings = dataclasses.replace(Settings(), fast_ramp=0.1, fast_seconds=0.5)
            figures = fastrunner.Load([], load, tmp, settings, 40).drive(f"unix:{socket}", 8)
            answer = subprocess.run(
                [
                    "curl",
                    "-sN",
                    "--unix-socket",
                    str(socket),
                    "http://runner/v1/chat/completions",
                    "-d",
                    "{}",
                ],
                capture_output=True,
                check=True,
                timeout=30,
            ).stdout
        self.assertEqual(figures["failed"], 0)
        # 8 streams of 50 events a second: 400 a second, give or take a tick at each end of the window.
        self.assertTrue(320 <= figures["events_per_s"] <= 480, figures)
        self.assertEqual(answer.count(b"data: {"), 41, "40 events and the usage chunk")
        self.assertTrue(answer.endswith(b"data: [DONE]\n\n"))
