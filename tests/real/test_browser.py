"""A browser's view of the daemon: Debian's headless Chromium, driven by Playwright.

A page served from another origin must not be able to read from mrunner; the same page
served from an allowed origin can. Nothing is downloaded: Playwright drives /usr/bin/chromium.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.web.server import Site
from twisted.web.static import Data

from tests.support.browser import CHROMIUM, FLAGS
from tests.support.daemon_cases import DaemonTestCase

# What a page's script tries: a simple GET, a POST with JSON (which a browser preflights), and
# a "simple" POST, which a browser sends without asking first: it must do nothing.
SCRIPT = """async (base) => {
  const attempt = async (path, init) => {
    try {
      const response = await fetch(base + path, init);
      return [response.status, await response.text()];
    } catch (e) {
      return ["failed", String(e)];
    }
  };
  return [
    await attempt("/v1/models"),
    await attempt("/engines/unload", {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({all: true}),
    }),
    await attempt("/engines/unload", {method: "POST", body: JSON.stringify({all: true})}),
  ];
}"""
PAGE = b"<!doctype html><title>a page</title><p>a page that calls mrunner</p>"


def visit(pages: list[str], daemon: str) -> dict[str, Any]:
    """What each page's script got from the daemon."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            results = {}
            for url in pages:
                page = browser.new_page()
                page.goto(url)
                results[url] = page.evaluate(SCRIPT, daemon)
                page.close()
            return results
        finally:
            browser.close()


class BrowserTests(DaemonTestCase):
    timeout = 120
    skip = None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: apt-get install chromium"

    def serve_page(self, interface: str, name: str) -> str:
        port = reactor.listenTCP(0, Site(Data(PAGE, "text/html")), interface=interface)  # type: ignore[attr-defined]
        self.addCleanup(port.stopListening)
        return f"http://{name}:{port.getHost().port}/"

    async def test_only_pages_from_allowed_origins_can_read_answers(self) -> None:
        await self.start()
        self.assertEqual((await self.post("/engines/v1/chat/completions", self.chat()))[0], 200)
        allowed = self.serve_page("127.0.0.1", "localhost")  # http://localhost:* is allowed by default
        other = self.serve_page("127.0.0.2", "127.0.0.2")  # another origin on this machine

        refused = (await deferToThread(visit, [other], self.daemon.url))[other]
        for status, text in refused:
            self.assertEqual(status, "failed", text)
            self.assertIn("Failed to fetch", text)
        self.assertEqual(len(self.runner_pids()), 1, "a refused page unloaded the runner")

        models, unload, _ = (await deferToThread(visit, [allowed], self.daemon.url))[allowed]
        self.assertEqual(models[0], 200, models)
        self.assertIn('"object": "list"', models[1])
        self.assertEqual(unload[0], 200, unload)
