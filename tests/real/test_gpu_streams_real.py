"""The GPU's concurrency table (bench/gpu_streams.py) rehearsed on the CPU build with a tiny model: every
shape measured direct and through mrunner, the verbose runner really at ``-lv 4``, the loads timed, and
the table written (figures only checked to be there: the machine is shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from bench.realstreams import END, RATE
from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.daemon import short_home
from tests.support.llamacpp_cases import cached_llama_server

REPO = Path(__file__).resolve().parents[2]


class StreamsTableTests(SynchronousTestCase):
    def test_cpu_rehearsal(self) -> None:
        server = cached_llama_server()
        tmp = short_home(self)
        gguf = tmp / "tiny.gguf"
        write_tiny_llama(gguf)
        out, logs = tmp / "out", tmp / "logs"
        argv = [sys.executable, "-m", "bench.gpu_streams", "--cpu", "--server", str(server)]
        argv += ["--gguf", str(gguf), "--shapes", "1:8,3:4", "--verbose-streams", "3"]
        run = subprocess.run(
            [*argv, "--out", str(out), "--logs", str(logs)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        table = json.loads((out / "streams.json").read_text())
        self.assertEqual(table["context"], {"per_stream": 1280, "pool": 3 * 1280})
        self.assertEqual([(row["streams"], row["tokens"]) for row in table["streams"]], [(1, 8), (3, 4)])
        for row in table["streams"]:
            for path in ("direct", "mrunner"):
                self.assertGreater(row[path][RATE], 0)
                self.assertGreater(row[path][END], 0)
        self.assertEqual(table["verbose"]["default"], table["streams"][1]["mrunner"])
        self.assertGreater(table["verbose"]["lv4"][RATE], 0)
        self.assertEqual(list(table["loads"]), ["cold load", "swap", "swap back"])
        self.assertIn("3 streams through mrunner, the runner at -lv 4", (out / "streams.txt").read_text())
        default, verbose = (
            (logs / home / "logs" / "ai_smollm2-long_latest-completion.log").read_text().splitlines()
            for home in ("streams-home", "streams-lv4")
        )
        self.assertIn("llama-server-lv4", verbose[0], "the verbose daemon's runner is the -lv 4 wrapper")
        self.assertGreater(len(verbose), len(default), "fewer answers, more lines: it logs at -lv 4")
