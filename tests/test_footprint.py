"""What the daemon loads at start, seen from a fresh interpreter (a real process: this one has loaded all)."""

from __future__ import annotations

import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase


class FootprintTests(SynchronousTestCase):
    def test_the_daemon_starts_without_numpy(self) -> None:
        """gguf and numpy (some 14 MB resident) load on the first GGUF read, not with the daemon."""
        loaded = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, mrunner.tap; print(sorted({'gguf', 'numpy'} & set(sys.modules)))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.assertEqual(loaded, "[]")
