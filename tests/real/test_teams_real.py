"""Named keys for real: the official openai and anthropic clients → mrunner → llama-server (tiny model).

A key limited to one model, a rate limit the client's own retry honours, a
concurrency limit under 50 parallel requests, priority classes with one runner
slot, a reload that changes keys without dropping a stream, and usage kept
across a restart.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import anthropic
import openai
import openai._base_client
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from mrunner.scheduling import priority
from tests.support.daemon import (
    InProcessDaemon,
    eventually,
    http,
    short_home,
    spawn_twistd,
    stop_twistd,
    unix_client,
    write_config,
)
from tests.support.ggufs import write_tiny_gguf
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase

HIGH, LOW = 0, 2  # the loader's classes: config.PRIORITIES' places

HI = [{"role": "user", "content": "hi"}]
MRUNNER = str(Path(sys.executable).with_name("mrunner"))
CLOSE = {"Connection": "close"}
KEYS = """
[http]
admin_api_keys = ["old-admin"]
[keys.alice]
key = "alice-key"
models = ["ai/tiny"]
requests_per_minute = 5
[keys.bob]
key = "bob-key"
max_concurrent = 2
[keys.root]
key = "root-key"
admin = true
[keys.high]
key = "high-key"
priority = "high"
[keys.low]
key = "low-key"
priority = "low"
"""
#: A stream the client holds unread stays busy: 4,000 tokens with their 20 likeliest neighbours
#: (7.5 MB) are more than the sockets hold, however fast the machine generates.
HELD = {"max_tokens": 4000, "stream": True, "logprobs": True, "top_logprobs": 20}


class TeamsTests(LlamaCppTestCase):
    timeout = 240

    async def start_keyed(self, extra: str = "", parallel: int = 2) -> None:
        await self.start(extra + KEYS, parallel=parallel)
        await self.tiny()

    def openai(self, key: str, retries: int = 0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.daemon.url + "/v1", api_key=key, max_retries=retries, default_headers=CLOSE
        )

    def chat(self, client: openai.OpenAI, **extra: Any) -> Any:
        return self.call(
            client.chat.completions.create, model=TINY, messages=HI, **{"max_tokens": 2, **extra}
        )

    async def usage(self, **query: str) -> list[dict[str, Any]]:
        response = await http.get(
            self.daemon.url + "/engines/usage", params=query, headers={"Authorization": "Bearer root-key"}
        )
        self.assertEqual(response.code, 200)
        return list(json.loads(await response.text())["data"])

    async def test_models_and_rate_limit(self) -> None:
        """alice may use ai/tiny only (403 naming the model elsewhere); her sixth request in a minute is
        a 429 the client waits out with Retry-After, as its own retry logic reads it."""
        await self.start_keyed()
        alice = self.openai("alice-key")
        with self.assertRaises(openai.PermissionDeniedError) as denied:
            await self.call(alice.chat.completions.create, model="ai/other", messages=HI, max_tokens=2)
        self.assertIn("ai/other:latest", denied.exception.message)
        claude = anthropic.Anthropic(
            base_url=self.daemon.url + "/anthropic", api_key="alice-key", max_retries=0, default_headers=CLOSE
        )
        with self.assertRaises(anthropic.PermissionDeniedError) as refused:
            await self.call(claude.messages.create, model="ai/other", max_tokens=2, messages=HI)
        self.assertEqual(refused.exception.body["error"]["type"], "permission_error")

        for _ in range(5):
            answer = await self.chat(alice)
            self.assertEqual(answer.usage.completion_tokens, 2)
        with self.assertRaises(openai.RateLimitError) as limited:
            await self.chat(alice)
        error = limited.exception
        self.assertEqual(error.code, "rate_limit_exceeded")
        headers = error.response.headers
        self.assertEqual(headers["x-ratelimit-limit-requests"], "5")
        self.assertEqual(headers["x-ratelimit-remaining-requests"], "0")
        self.assertTrue(headers["x-ratelimit-reset-requests"].endswith("s"))
        retry_after = int(headers["retry-after"])
        self.assertTrue(0 < retry_after <= 60, retry_after)
        with self.assertRaises(anthropic.RateLimitError) as slowed:
            await self.call(claude.messages.create, model=TINY, max_tokens=2, messages=HI)
        self.assertEqual(slowed.exception.body["error"]["type"], "rate_limit_error")
        response = await http.post(
            self.daemon.url + "/api/chat",
            json={"model": TINY, "messages": HI},
            headers={"Authorization": "Bearer alice-key"},
        )
        self.assertEqual((response.code, list(json.loads(await response.text()))), (429, ["error"]))

        # The client's retry sleeps what the headers say; here that sleep moves the key's clock instead.
        slept: list[float] = []
        teams, now = self.daemon.teams, self.daemon.teams.now
        skew = [0.0]
        teams.now = lambda: now() + skew[0]

        class Sleepless:
            def __getattr__(self, name: str) -> Any:
                return getattr(time, name)

            def sleep(self, seconds: float) -> None:
                slept.append(seconds)
                skew[0] += seconds

        self.patch(openai._base_client, "time", Sleepless())
        answer = await self.chat(self.openai("alice-key", retries=2))
        self.assertEqual(answer.usage.completion_tokens, 2)
        self.assertEqual(len(slept), 1, "one wait, as long as the server said, was enough")
        self.assertLess(abs(slept[0] - retry_after), 1, "retry-after-ms says it more exactly")

    async def test_max_concurrent_under_50_parallel(self) -> None:
        """bob (max_concurrent = 2) sends 50 at once and holds the streams he gets: two, and 48 429s."""
        await self.start_keyed()
        bob = self.openai("bob-key")
        results: list[str] = []
        streams: list[Any] = []
        lock, release = threading.Lock(), threading.Event()

        def one() -> None:
            try:
                stream = bob.chat.completions.create(model=TINY, messages=HI, **HELD)
            except openai.RateLimitError as e:
                with lock:
                    results.append(e.code or "")
                return
            with lock:
                results.append("streaming")
                streams.append(stream)
            release.wait(60)
            stream.close()

        threads = [threading.Thread(target=one) for _ in range(50)]
        for thread in threads:
            thread.start()
        await eventually(lambda: len(results) == 50, 60, what=lambda: f"50 answers, have {len(results)}")
        release.set()
        await deferToThread(lambda: [thread.join() for thread in threads])
        self.assertEqual(sorted(set(results)), ["rate_limit_exceeded", "streaming"])
        self.assertEqual(results.count("streaming"), 2)
        await eventually(lambda: self.daemon.teams._allowances["bob"].in_flight == 0, 30)
        await self.chat(bob)

    async def test_high_overtakes_low_and_the_starved_are_served(self) -> None:
        """One runner slot: queued lows wait while a high goes first; a low that waits long enough is
        served however many highs keep coming. The order is the loader's own (which waiter each
        freed slot goes to): clients may hear their answers in another order on a busy machine."""
        await self.start_keyed('max_runners = 1\nstarvation_seconds = "1h"\n', parallel=1)
        low, high = self.openai("low-key"), self.openai("high-key")
        handed: list[tuple[int, float]] = []  # (class, arrival) of each waiter a freed slot went to
        pick = priority.first

        def recorded(queue: Any, now: float, starvation: float) -> Any:
            head = pick(queue, now, starvation)
            if head is not None:
                handed.append((head.priority, head.since))
            return head

        self.patch(priority, "first", recorded)
        held = await self.call(low.chat.completions.create, model=TINY, messages=HI, **HELD)
        queued = self.daemon.scheduler.queued
        waiting = []
        for count, client in enumerate((low, low, high), start=1):
            waiting.append(self.chat(client))
            await eventually(lambda count=count: queued() == count, 30)
        await self.call(held.close)
        for d in waiting:
            await d
        self.assertEqual([rank for rank, since in handed], [HIGH, LOW, LOW])
        self.assertLess(handed[1][1], handed[2][1])  # first come, first served within a class

        # A starved low: six highs queue behind it, and each would go first. When the loader hands
        # the third of them its slot, its clock moves on two hours: the low has starved, and goes next.
        handed.clear()
        loader = self.daemon.scheduler.loader
        skew = [0.0]

        class Skewed:
            def __getattr__(self, name: str) -> Any:
                return getattr(reactor, name)

            def seconds(self) -> float:
                return float(reactor.seconds()) + skew[0]

        def starving(queue: Any, now: float, starvation: float) -> Any:
            if len(handed) == 3:
                skew[0] = 7200
                now += 7200
            return recorded(queue, now, starvation)

        self.patch(loader, "_clock", Skewed())
        self.patch(priority, "first", starving)
        held = await self.call(high.chat.completions.create, model=TINY, messages=HI, **HELD)
        waiting = [self.chat(low)]
        await eventually(lambda: queued() == 1, 30)
        for count in range(2, 8):
            waiting.append(self.chat(high))
            await eventually(lambda count=count: queued() == count, 30)
        await self.call(held.close)
        for d in waiting:
            await d
        self.assertEqual([rank for rank, since in handed].index(LOW), 3, handed)

    async def test_usage_survives_a_restart_and_reload_applies_keys(self) -> None:
        await self.start_keyed()
        root = self.openai("root-key")
        stream = await self.call(
            root.chat.completions.create, model=TINY, messages=HI, max_tokens=300, stream=True
        )
        answer = await self.chat(self.openai("bob-key"), max_tokens=3)

        # bob's key goes; root's stream, begun before, goes on.
        config = self.daemon.config_path
        config.write_text(config.read_text().replace('key = "bob-key"', 'key = "bob-new-key"'))
        response = await http.post(
            self.daemon.url + "/engines/_reload", headers={"Authorization": "Bearer old-admin"}
        )
        self.assertEqual(response.code, 200, await response.text())
        with self.assertRaises(openai.AuthenticationError):
            await self.chat(self.openai("bob-key"))
        await self.chat(self.openai("bob-new-key"), max_tokens=1)
        chunks = await self.call(lambda: sum(1 for _ in stream))
        self.assertGreaterEqual(chunks, 300, "the stream was not cut")

        rows = {row["key"]: row for row in await self.usage(model="tiny")}
        self.assertEqual(set(rows), {"bob", "root"})
        self.assertEqual((rows["bob"]["requests"], rows["bob"]["completion_tokens"]), (2, 4))
        self.assertEqual(rows["root"]["completion_tokens"], 300)
        self.assertEqual(rows["bob"]["prompt_tokens"], answer.usage.prompt_tokens * 2)
        self.assertEqual(await self.usage(key="nobody"), [])
        response = await http.get(
            self.daemon.url + "/engines/usage", headers={"Authorization": "Bearer bob-new-key"}
        )
        own = json.loads(await response.text())["data"]
        self.assertEqual({row["key"] for row in own}, {"bob"}, "a normal key reads its own usage only")
        response = await http.get(
            self.daemon.url + "/engines/usage?from=yesterday", headers={"Authorization": "Bearer root-key"}
        )
        self.assertEqual(response.code, 400)
        response = await http.get(
            self.daemon.url + "/engines/usage?to=", headers={"Authorization": "Bearer root-key"}
        )
        self.assertEqual(response.code, 400, "an empty day is no day (the fuzzer's find)")
        metrics = await (
            await http.get(self.daemon.url + "/metrics", headers={"Authorization": "Bearer root-key"})
        ).text()
        self.assertIn('mrunner_key_tokens_total{key="bob",kind="completion"} 4.0', metrics)
        self.assertNotIn("bob-new-key", metrics)

        await self.daemon.stop()
        self.daemon = InProcessDaemon(config)
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))
        again = {row["key"]: row for row in await self.usage()}
        self.assertEqual(again["bob"]["completion_tokens"], 4)
        self.assertEqual(again["root"]["completion_tokens"], 300)


class UsageDurabilityTests(TestCase):
    """``twistd mrunner`` killed with SIGKILL keeps the usage it had written (once a second); the next
    daemon reads it, and ``mrunner usage`` shows it. The scripted runner answers 1 + 1 tokens."""

    timeout = 120

    async def daemon(self, home: Path, config: Path, output: str) -> Any:
        process = spawn_twistd(config, home, output_name=output)
        self.addCleanup(lambda: ensureDeferred(stop_twistd(process)) if process.pid else None)
        await eventually(lambda: (home / "api.sock").exists(), 30)
        return process

    async def test_usage_survives_sigkill(self) -> None:
        home = short_home(self)
        config = write_config(home, 'listen = "unix:{}"\n{}'.format(home / "api.sock", KEYS))
        process = await self.daemon(home, config, "first.out")
        client = unix_client(str(home / "api.sock"))
        gguf = home / "tiny.gguf"
        write_tiny_gguf(gguf)
        admin = {"Authorization": "Bearer old-admin"}
        with gguf.open("rb") as f:
            response = await client.post("http://d/models/load", params={"name": TINY}, data=f, headers=admin)
            await response.content()
        for _ in range(3):
            response = await client.post(
                "http://d/v1/chat/completions",
                json={"model": TINY, "messages": HI},
                headers={"Authorization": "Bearer bob-key"},
            )
            self.assertEqual(response.code, 200, await response.text())

        def written() -> list[Any]:
            with closing(sqlite3.connect(home / "usage.sqlite")) as db:
                return db.execute(
                    "SELECT key, requests, prompt_tokens, completion_tokens FROM usage"
                ).fetchall()

        await eventually(
            lambda: written() == [("bob", 3, 3, 3)], 30, what=lambda: f"the file, with {written()}"
        )
        os.kill(process.pid, signal.SIGKILL)
        await process.output.ended
        os.unlink(home / "api.sock")

        await self.daemon(home, config, "second.out")
        response = await client.get("http://d/engines/usage?key=bob", headers=admin)
        rows = (await response.json())["data"]
        self.assertEqual(
            [(r["key"], r["model"], r["requests"], r["completion_tokens"]) for r in rows],
            [("bob", TINY, 3, 3)],
        )
        socket = "unix:" + str(home / "api.sock")
        shown = await deferToThread(
            subprocess.run,
            [MRUNNER, "--host", socket, "--api-key", "old-admin", "usage"],
            capture_output=True,
            text=True,
        )
        self.assertEqual(shown.returncode, 0, shown.stderr)
        header, line = shown.stdout.splitlines()
        self.assertEqual(
            header.split(),
            [
                c.upper()
                for c in ("day", "key", "model", "requests", "prompt", "completion", "errors", "seconds")
            ],
        )
        self.assertEqual(line.split()[1:7], ["bob", TINY, "3", "3", "3", "0"])
        shown = await deferToThread(
            subprocess.run,
            [MRUNNER, "--host", socket, "--api-key", "old-admin", "usage", "--json", "--key", "alice"],
            capture_output=True,
            text=True,
        )
        self.assertEqual(json.loads(shown.stdout), {"object": "list", "data": []})
