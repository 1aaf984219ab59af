"""The web page at /ui in a real browser: Debian's headless Chromium driven by Playwright.

A real daemon, a real llama-server runner of the tiny model (which never ends an answer by
itself: it writes max_tokens words, so an answer's length is set by count, not by time),
and the real registry for the pull. Nothing is downloaded: Playwright drives /usr/bin/chromium.
Screenshots of each view go to the test's temporary folder.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread

from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.browser import CHROMIUM, chromium_page
from tests.support.daemon import http
from tests.support.ggufs import write_tiny_gguf
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase
from tests.support.registry_server import SKIP as NO_REGISTRY
from tests.support.registry_server import RealRegistry

PAGE_LIMIT = 100 * 1024
# The page's tiny model says it was trained for this context (llama-server gives a request no
# more than that, whatever context_size asks).
CONTEXT = 16384
# The first answer is stopped, however late Stop lands, within this many tokens: the tiny model
# writes 2,000 a second here, and its words glued together read back as 3 tokens each (measured:
# 3,000 written, 9,068 on /tokenize), so the next turn still fits in CONTEXT.
FIRST_ANSWER_TOKENS = 4000
# While it streams, the page's network is held to this many bytes a second, so the answer (some
# 200 bytes an event) takes minutes to reach the page and Stop always lands before its end: on
# one busy core llama-server wrote all of it before a click landed, and Stop was disabled again.
SLOW_BYTES_PER_SECOND = 4096
# Every value the pull's progress bar takes, as the page sets it.
WATCH_BAR = """() => {
  window.barValues = [];
  const bar = document.getElementById("pull-bar");
  const value = Object.getOwnPropertyDescriptor(HTMLProgressElement.prototype, "value");
  Object.defineProperty(bar, "value", {
    get() { return value.get.call(this); },
    set(v) { value.set.call(this, v); window.barValues.push(v); },
  });
}"""
WEIGHT = """() => performance.getEntriesByType("navigation").concat(performance.getEntriesByType("resource"))
  .filter((entry) => new URL(entry.name).pathname.startsWith("/ui"))
  .reduce((sum, entry) => sum + entry.decodedBodySize, 0)"""


def throttle(network: Any, bytes_per_second: int) -> None:
    """Hold the page's downloads to C{bytes_per_second} (-1: no limit), as DevTools' throttling does."""
    conditions = {"offline": False, "latency": 0, "uploadThroughput": -1}
    network.send("Network.emulateNetworkConditions", {**conditions, "downloadThroughput": bytes_per_second})


def drive(base: str, pulled: str, shots: Path) -> dict[str, Any]:
    """Walk through every view as a person would; what was seen comes back for the test to check."""
    seen: dict[str, Any] = {"requests": []}
    with chromium_page(viewport={"width": 1280, "height": 860}) as page:
        page.on("request", lambda request: seen["requests"].append(request.url))
        page.on("pageerror", lambda error: seen.setdefault("errors", []).append(str(error)))
        page.goto(base + "/")  # a browser's GET / goes to the page
        seen["url"] = page.url
        page.wait_for_selector(f'#model-rows tr[data-model="{TINY}"]')
        page.wait_for_selector('#device-bars .device:has-text("CPU")')
        seen["devices"] = page.inner_text("#device-bars")
        seen["weight"] = page.evaluate(WEIGHT)
        page.screenshot(path=str(shots / "models.png"), full_page=True)

        # Chat: Stop ends an answer once it is longer than 20 characters. The answer is bounded
        # by count, not by how fast Stop lands: the tiny model writes max_tokens words, and
        # FIRST_ANSWER_TOKENS leave room in its context for the next turn however late Stop is.
        page.click('#tabs button[data-view="chat"]')
        page.select_option("#chat-model", TINY)
        page.fill("#chat-max-tokens", str(FIRST_ANSWER_TOKENS))
        page.fill("#chat-input", "Write a very long story about a lighthouse keeper and the sea.")
        network = page.context.new_cdp_session(page)
        throttle(network, SLOW_BYTES_PER_SECOND)
        page.click("#chat-send")
        page.wait_for_function("() => document.querySelector('.msg.assistant span').textContent.length > 20")
        page.click("#chat-stop")
        page.wait_for_selector('.msg.assistant[data-state="stopped"]')
        throttle(network, -1)
        seen["stopped_text"] = page.inner_text(".msg.assistant")
        page.wait_for_selector(f'#runner-rows tr[data-model="{TINY}"][data-in-use="0"]')

        # The conversation goes on, with a small token limit this time.
        page.fill("#chat-max-tokens", "8")
        page.fill("#chat-input", "hello")
        page.click("#chat-send")
        page.wait_for_selector('.msg.assistant[data-state="done"]')
        seen["second_answer"] = page.inner_text('.msg.assistant[data-state="done"] span')
        page.wait_for_selector(f'#runner-rows tr[data-model="{TINY}"][data-in-use="0"]')
        page.screenshot(path=str(shots / "chat.png"), full_page=True)

        # A turn the model's context cannot hold: the page says so and offers a new conversation.
        page.fill("#chat-input", "the sea " * CONTEXT)
        page.click("#chat-send")
        page.wait_for_selector('.msg.assistant[data-state="too-long"]')
        seen["too_long"] = page.inner_text('.msg.assistant[data-state="too-long"]')
        page.screenshot(path=str(shots / "too-long.png"), full_page=True)
        page.click("#chat-new")
        seen["after_new"] = page.eval_on_selector("#conversation", "c => c.children.length")

        # Unload from the runners table.
        page.click(f'#runner-rows tr[data-model="{TINY}"] button')
        page.wait_for_selector(f'#runner-rows tr[data-model="{TINY}"]', state="detached")
        page.screenshot(path=str(shots / "runners.png"), full_page=True)

        # Pull from the local registry, the bar moving; then delete with the confirmation.
        page.click('#tabs button[data-view="models"]')
        page.evaluate(WATCH_BAR)
        page.fill("#pull-ref", pulled)
        page.click("#pull-form button")
        page.wait_for_selector("#pull-status:has-text('Model pulled successfully')")
        page.wait_for_selector(f'#model-rows tr[data-model="{pulled}"]')
        seen["bar"] = page.evaluate("window.barValues")
        page.screenshot(path=str(shots / "pull.png"), full_page=True)
        page.once("dialog", lambda dialog: (seen.__setitem__("confirm", dialog.message), dialog.accept()))
        page.click(f'#model-rows tr[data-model="{pulled}"] button')
        page.wait_for_selector(f'#model-rows tr[data-model="{pulled}"]', state="detached")

        # Logs of one runner, following; then the request records, newest first.
        page.click('#tabs button[data-view="logs"]')
        page.select_option("#log-source", TINY)
        page.wait_for_selector("#log-lines:has-text('[ai_tiny_latest-completion]')")
        seen["log"] = page.inner_text("#log-lines")
        seen["log_sources"] = {
            line.split("]")[0] for line in page.inner_text("#log-lines").splitlines() if line
        }
        page.screenshot(path=str(shots / "logs.png"), full_page=True)
        page.click('#tabs button[data-view="requests"]')
        page.wait_for_function("() => document.querySelectorAll('#request-rows tr').length >= 2")
        seen["request_ids"] = page.eval_on_selector_all(
            "#request-rows tr", "rows => rows.map(r => Number(r.dataset.id))"
        )
        page.screenshot(path=str(shots / "requests.png"), full_page=True)
    return seen


class PageTests(LlamaCppTestCase):
    timeout = 300
    skip = (
        NO_REGISTRY
        if NO_REGISTRY
        else (None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: apt-get install chromium")
    )

    async def publish(self, name: str) -> None:
        """Put a model of 2 MiB in the local registry as C{name}, and take it out of the store."""
        gguf = self.home / "published.gguf"
        write_tiny_gguf(gguf, rows=32768)
        await self.daemon.import_model(name, gguf)
        response = await http.post(f"{self.daemon.url}/models/{name}/push")
        lines = [json.loads(line) for line in (await response.text()).splitlines()]
        self.assertEqual(lines[-1]["type"], "success", lines)
        response = await http.delete(f"{self.daemon.url}/models/{name}")
        self.assertEqual(response.code, 200, await response.text())

    async def test_every_view(self) -> None:
        await self.start(f'[models."{TINY}"]\ncontext_size = {CONTEXT}\n')
        await self.tiny(TINY, partial(write_tiny_llama, context=CONTEXT))
        registry = RealRegistry(self.home / "registry")
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        pulled = f"{registry.host}/team/tiny:v1"
        await self.publish(pulled)
        shots = Path(self.mktemp())
        shots.mkdir(parents=True)

        seen = await deferToThread(drive, self.daemon.url, pulled, shots)

        self.assertEqual(seen.get("errors"), None, "the page's script failed")
        self.assertEqual(seen["url"], self.daemon.url + "/ui")
        self.assertLess(seen["weight"], PAGE_LIMIT)
        self.assertGreater(seen["weight"], 10_000, "the page, its script and its style were measured")
        strangers = [url for url in seen["requests"] if not url.startswith(self.daemon.url + "/")]
        self.assertEqual(strangers, [], "every request stays on this machine, with the daemon")
        self.assertTrue(seen["second_answer"])
        self.assertIn("host memory", seen["devices"], "a memory bar for the RAM (device CPU)")
        self.assertIn("(stopped)", seen["stopped_text"])
        self.assertIn(f"no longer fits in the model's context of {CONTEXT} tokens", seen["too_long"])
        self.assertIn("Start a new conversation", seen["too_long"])
        self.assertEqual(seen["after_new"], 0, "the new conversation starts empty")
        bar = seen["bar"]
        self.assertTrue([v for v in bar if 0 < v < 1], f"the bar moved through {bar}")
        self.assertEqual(bar[-1], 1)
        self.assertIn(pulled, seen["confirm"])
        self.assertEqual(seen["log_sources"], {"[ai_tiny_latest-completion"})
        self.assertIn("cancel task", seen["log"], "llama-server stopped generating when the page stopped")
        self.assertEqual(seen["request_ids"], sorted(seen["request_ids"], reverse=True))

        answer = await http.get(f"{self.daemon.url}/engines/requests?model={TINY}")
        records = json.loads(await answer.text())
        # The stopped stream's record is not checked for being cut short: the page's throttle holds
        # what the page reads, not what the daemon writes, and the daemon may have written the whole
        # answer into the socket's buffers before Stop reached it (seen on one core).
        self.assertEqual(
            [(r["status"], r["completed"]) for r in records[:2]] + [(records[2]["status"],)],
            [(400, True), (200, True), (200,)],
            "newest first: the turn too long, the second answer, the stopped stream",
        )
        self.assertEqual(
            [p.name for p in sorted(shots.iterdir())],
            ["chat.png", "logs.png", "models.png", "pull.png", "requests.png", "runners.png", "too-long.png"],
        )
