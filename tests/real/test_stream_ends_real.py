"""Streams end when the runner ends (issue 48): the real llama-server, several clients at once, a core
kept busy, each answer read to its end by a client that looks for the end in its last read.

llama-server writes a chunked answer's end in two writes; passed on apart, such a client waited
for the daemon to close the idle connection, a minute later. Here four streams of each size of a
sweep go to the runner direct, then through mrunner, and each through mrunner must end whole
within five times the slowest direct one and 20 s: a held end waits for the idle close, 60 s, so
it fails on any machine of this kind, while a busy one's slowness does not. The runner has one
thread, as the bench's do: with llama-server's default (every core) and a core kept busy, its own
threads wait on each other and a stream of 288 tokens took 0.3 s once and 48 s the next, direct or
not; with one, both take 0.1 to 0.3 s.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from twisted.internet.threads import deferToThread

from tests.support.llamacpp_cases import TINY, LlamaCppTestCase
from tests.support.raw_streams import chat_request, ended_whole, read_stream

STREAMS = 4
SIZES = range(160, 321, 32)


def at_once(address: str | tuple[str, int], request: bytes) -> list[tuple[float, list[bytes]]]:
    """C{STREAMS} streams of C{request} at once, each read to its end."""
    with ThreadPoolExecutor(STREAMS) as pool:
        return list(pool.map(lambda _: read_stream(address, request), range(STREAMS)))


class StreamEndsTests(LlamaCppTestCase):
    timeout = 300

    async def test_concurrent_streams_of_each_size_end_soon_after_direct(self) -> None:
        await self.start("[runner]\nthreads = 1\n", parallel=STREAMS)  # see the module docstring
        await self.tiny()
        host, port = self.daemon.url.removeprefix("http://").split(":")
        warm = chat_request({"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        await deferToThread(read_stream, (host, int(port)), warm)  # loads the runner
        [runner] = self.daemon.scheduler.snapshot()
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        self.addCleanup(busy.wait)
        self.addCleanup(busy.kill)
        for tokens in SIZES:
            body = {
                "model": TINY,
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": tokens,
                "ignore_eos": True,
                "stream": True,
            }
            direct = await deferToThread(at_once, runner.socket, chat_request(body))
            through = await deferToThread(at_once, (host, int(port)), chat_request(body))
            bound = 5 * max(seconds for seconds, _ in direct) + 20
            for _, reads in through:
                self.assertTrue(ended_whole(reads), f"{tokens} tokens: {reads[-2:]!r}")
            for seconds, _ in through:
                self.assertLess(
                    seconds, bound, f"{tokens} tokens: a stream ended {seconds:.1f}s after it began"
                )
