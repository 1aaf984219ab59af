"""The web page with API keys on, in headless Chromium: it asks for a key and keeps it in the tab.

No runner is needed: the page's files load without a key (a navigation cannot carry one), its
first API call answers 401, and the key typed in then reaches every route, admin ones included.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.daemon import InProcessDaemon, short_home, write_config
from tests.test_browser import CHROMIUM, FLAGS
from tests.test_page import WAIT_MS

KEY = "sk-page-key"


def visit(base: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(base + "/")
            seen["url"] = page.url
            page.wait_for_selector("#key-form:not([hidden])")
            page.fill("#key-input", KEY)
            page.click("#key-form button")
            page.wait_for_selector("#no-models:not([hidden])")  # GET /models is an admin route
            page.wait_for_function("() => document.getElementById('summary').textContent.includes('loaded')")
            seen["stored"] = page.evaluate("() => sessionStorage.getItem('mrunner-key')")
            seen["form_hidden"] = page.is_hidden("#key-form")
        finally:
            browser.close()
    return seen


class PageKeyTests(TestCase):
    timeout = 120
    skip = None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: apt-get install chromium"

    async def test_asks_for_a_key_and_keeps_it_in_the_session(self) -> None:
        home = short_home(self)
        daemon = InProcessDaemon(write_config(home, f'[http]\napi_keys = ["{KEY}"]\n'))
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        seen = await deferToThread(visit, daemon.url)
        self.assertEqual(seen["url"], daemon.url + "/ui")
        self.assertEqual(seen["stored"], KEY)
        self.assertTrue(seen["form_hidden"])
