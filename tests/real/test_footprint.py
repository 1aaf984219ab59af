"""What the daemon keeps loaded, seen from a fresh interpreter (a real process: this one has loaded all)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner.testing.tinymodel import write_tiny_llama

CHECK = """
import sys
import mrunner.tap
from mrunner.store import gguf_meta
gguf_meta.read(sys.argv[1])
print(sorted({"gguf", "numpy"} & set(sys.modules)))
"""


class FootprintTests(SynchronousTestCase):
    def test_reading_a_gguf_leaves_numpy_out_of_the_daemon(self) -> None:
        """gguf and numpy (some 20 MB resident) load in the child that reads the file, never in the daemon."""
        with tempfile.TemporaryDirectory() as directory:
            gguf = Path(directory) / "tiny.gguf"
            write_tiny_llama(gguf)
            loaded = subprocess.run(
                [sys.executable, "-c", CHECK, str(gguf)], capture_output=True, text=True, check=True
            ).stdout.strip()
        self.assertEqual(loaded, "[]")
