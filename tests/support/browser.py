"""Debian's Chromium, headless, for the tests of the web page and of what a page may ask."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 90_000  # for what must happen; only a broken page waits this long (2 busy cores load slowly)


@contextlib.contextmanager
def chromium_page(**options: Any) -> Iterator[Page]:
    """A page in Debian's Chromium driven by Playwright (nothing downloaded), waiting at most WAIT_MS."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page(**options)
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            browser.close()
