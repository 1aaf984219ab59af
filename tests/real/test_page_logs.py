"""The page's Logs view on a long log, in headless Chromium: the tail shown at once, new lines appended.

Issue 35's case: 1.3 MB of logs in 9,153 lines, which the view wrote into its <pre> one line at
a time, each time re-setting up to 200 KB of text: the tab's main thread was blocked for 227 s.
The view now changes once per batch of lines (counted here by a MutationObserver, so the check
does not hang on the machine's speed) and keeps only the last lines in the page. No runner is
needed: the logs are files in the home's logs/, as the runners write them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.browser import CHROMIUM, chromium_page
from tests.support.daemon import InProcessDaemon, short_home, write_config

SOURCES = ("ai_one_latest-completion", "ai_three_latest-completion", "ai_two_latest-completion")
LINES = 3051  # per log: 9,153 lines, 1.3 MB in all
APPENDED = 5
SHOWN_MS = 30_000  # the line-at-a-time view took 227 s; batched, well under a second here
# The daemon's own log is followed too, and its access log (the page's own requests) may come in
# at any time: the lines counted are the runners' logs'.
WATCH = """() => {
  window.runnerLines = () => document.getElementById("log-lines").textContent.split("\\n").slice(0, -1)
    .filter((line) => !line.startsWith("[daemon] "));
  window.logChanges = 0;
  new MutationObserver((records) => { window.logChanges += records.length; })
    .observe(document.getElementById("log-lines"), { childList: true, characterData: true, subtree: true });
}"""
STATE = """() => {
  const pre = document.getElementById("log-lines");
  const lines = window.runnerLines();
  return {
    lines: lines.length, first: lines[0], last: lines[lines.length - 1], nodes: pre.childNodes.length,
    changes: window.logChanges, at_bottom: pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4,
  };
}"""
SHOWS = "(line) => window.runnerLines().at(-1) === line"


def log_line(number: int) -> str:
    """A line about as long as llama-server's request lines (140 bytes)."""
    text = f"srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200 line {number:05d} "
    return text.ljust(140, ".")


def visit(base: str, log: Path) -> dict[str, Any]:
    """Open the Logs view, then append to C{log} while it follows; the view's state after each."""
    seen: dict[str, Any] = {}
    with chromium_page() as page:
        page.goto(base + "/")
        page.evaluate(WATCH)
        page.click('#tabs button[data-view="logs"]')
        page.wait_for_function(SHOWS, arg=f"[{log.stem}] {log_line(LINES - 1)}", timeout=SHOWN_MS)
        seen["tail"] = page.evaluate(STATE)
        with log.open("a") as f:
            f.writelines(log_line(LINES + n) + "\n" for n in range(APPENDED))
        page.wait_for_function(SHOWS, arg=f"[{log.stem}] {log_line(LINES + APPENDED - 1)}", timeout=SHOWN_MS)
        seen["followed"] = page.evaluate(STATE)
    return seen


class PageLogsTests(TestCase):
    timeout = 120
    skip = None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: apt-get install chromium"

    async def test_a_long_log_shows_its_tail_in_batches_and_follows(self) -> None:
        home = short_home(self)
        daemon = InProcessDaemon(write_config(home))
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        logs = home / "logs"
        for source in SOURCES:
            (logs / f"{source}.log").write_text("".join(log_line(n) + "\n" for n in range(LINES)))
        seen = await deferToThread(visit, daemon.url, logs / f"{SOURCES[-1]}.log")
        tail, followed = seen["tail"], seen["followed"]
        self.assertEqual(tail["last"], f"[{SOURCES[-1]}] {log_line(LINES - 1)}")
        self.assertTrue(tail["at_bottom"], tail)
        # A tail: not the first log's first lines, yet a screenful and more.
        self.assertLess(tail["lines"], len(SOURCES) * LINES)
        self.assertGreater(tail["lines"], 500)
        self.assertNotEqual(tail["first"], f"[{SOURCES[0]}] {log_line(0)}")
        # In batches: the 9,153 lines changed the view a few times, not once a line.
        self.assertLess(tail["changes"], len(SOURCES) * LINES // 20, tail)
        self.assertLess(tail["nodes"], 100, tail)
        self.assertEqual(followed["last"], f"[{SOURCES[-1]}] {log_line(LINES + APPENDED - 1)}")
        self.assertTrue(followed["at_bottom"], followed)
        self.assertLessEqual(followed["lines"], tail["lines"] + APPENDED)
        self.assertLess(followed["changes"] - tail["changes"], 2 * APPENDED + 2, followed)
