"""`mrunner bench` against a daemon running the real llama-server with a tiny GGUF: counts and shape only
(the machine is shared, so no timing is asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from tests.support.llamacpp_cases import TINY, LlamaCppTestCase

MRUNNER = str(Path(sys.executable).with_name("mrunner"))


class BenchTests(LlamaCppTestCase):
    async def bench(self, *args: str) -> str:
        out, err, code = await getProcessOutputAndValue(
            MRUNNER, ["--host", self.daemon.url, "bench", TINY, *args], env={}, reactor=reactor
        )
        self.assertEqual(code, 0, err)
        return out.decode()

    async def test_json_and_table(self) -> None:
        await self.start(parallel=2)
        await self.tiny()
        common = ("--concurrency", "1,3", "--prompt-tokens", "16", "--max-tokens", "5")
        report = json.loads(await self.bench(*common, "--json"))
        self.assertEqual((report["model"], report["prompt_tokens"], report["max_tokens"]), (TINY, 16, 5))
        self.assertGreaterEqual(report["load_seconds"], 0)
        levels = report["levels"]
        self.assertEqual([(one["concurrency"], one["requests"]) for one in levels], [(1, 1), (3, 3)])
        self.assertEqual(
            [one["completion_tokens"] for one in levels], [5, 15], "ignore_eos: every token made"
        )
        self.assertEqual(levels[1]["prompt_tokens"], 3 * levels[0]["prompt_tokens"])
        self.assertGreaterEqual(levels[0]["prompt_tokens"], 16)
        for one in levels:
            self.assertGreater(one["tokens_per_second"], 0)
            self.assertEqual(set(one["time_to_first_token"]), {"mean", "max"})
        (runner,) = self.daemon.scheduler.snapshot()
        self.assertEqual(runner.model_name, TINY)
        table = await self.bench(*common)
        self.assertIn(f"{TINY}: loaded in", table)
        rows = [line.split() for line in table.splitlines() if "█" in line]
        self.assertEqual([row[0] for row in rows], ["1", "3"], "a row with a bar per concurrency")
        self.assertTrue(all(row[-1] == "ms" for row in rows))

    async def test_missing_model(self) -> None:
        await self.start()
        _out, err, code = await getProcessOutputAndValue(
            MRUNNER, ["--host", self.daemon.url, "bench", "ai/absent"], env={}, reactor=reactor
        )
        self.assertEqual(code, 1)
        self.assertIn("ai/absent", err.decode())
