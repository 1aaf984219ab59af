"""Runners a crashed daemon left behind are killed, and their sockets removed, at start.

This test starts a real (sleeping) process to play the orphan.
"""

import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from mrunner.home import Home
from mrunner.runners.process import clean_stale
from tests.support.daemon import short_home


class CleanStaleTests(SynchronousTestCase):
    def test_kills_orphans_and_removes_sockets(self) -> None:
        home = Home(short_home(self))
        run = home.run
        run.mkdir()
        socket = run / "r1-1.sock"
        orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(socket)])
        self.addCleanup(orphan.kill)
        socket.touch()
        socket.with_suffix(".pid").write_text(str(orphan.pid))
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.addCleanup(bystander.kill)
        (run / "r1-2.pid").write_text(str(bystander.pid))
        clean_stale(home)
        self.assertEqual(orphan.wait(5), -9)
        self.assertIsNone(bystander.poll(), "a pid file naming someone else's process kills nothing")
        self.assertEqual(list(run.iterdir()), [])
