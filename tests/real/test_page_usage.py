"""The page's Usage view in headless Chromium: its chart of tokens per day per key, and the table;
without named keys, the daemon's word on how to keep usage, not an error.

The scripted runner (tests/support/runner_program.py) answers each chat with 1 prompt and 1
completion token, so alice's three requests and bob's one are 6 and 2 tokens today.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.browser import CHROMIUM, chromium_page
from tests.support.daemon import InProcessDaemon, http, short_home, write_config
from tests.support.ggufs import write_tiny_gguf

MODEL = "ai/tiny:latest"
KEYS = """
[http]
admin_api_keys = ["page-admin"]
[keys.alice]
key = "alice-key"
[keys.bob]
key = "bob-key"
"""


def visit(base: str, screenshot: Path) -> dict[str, Any]:
    with chromium_page() as page:
        page.goto(base + "/")
        page.wait_for_selector("#key-form:not([hidden])")
        page.fill("#key-input", "page-admin")
        page.click("#key-form button")
        page.click('#tabs button[data-view="usage"]')
        page.wait_for_selector("#usage-svg rect")
        page.screenshot(path=str(screenshot), full_page=True)
        return {
            "bars": page.eval_on_selector_all(
                "#usage-svg rect",
                "bars => bars.map(b => [b.dataset.key, Number(b.dataset.tokens), b.getBBox().height])",
            ),
            "legend": page.inner_text("#usage-chart .legend"),
            "rows": page.eval_on_selector_all(
                "#usage-rows tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
            ),
            "days": page.eval_on_selector_all("#usage-svg text", "labels => labels.map(l => l.textContent)"),
        }


def visit_unkeyed(base: str) -> dict[str, str]:
    with chromium_page() as page:
        page.goto(base + "/")
        page.click('#tabs button[data-view="usage"]')
        page.wait_for_selector("#no-usage:not([hidden])")
        return {"notice": page.inner_text("#no-usage"), "status": page.inner_text("#status")}


class PageUsageTests(TestCase):
    timeout = 120
    skip = None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: apt-get install chromium"

    async def test_usage_view_draws_tokens_per_day_per_key(self) -> None:
        home = short_home(self)
        daemon = InProcessDaemon(write_config(home, KEYS))
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        gguf = home / "tiny.gguf"
        write_tiny_gguf(gguf)
        await daemon.import_model(MODEL, gguf)
        for key in ("alice-key", "alice-key", "alice-key", "bob-key"):
            response = await http.post(
                f"{daemon.url}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {key}"},
            )
            self.assertEqual(response.code, 200, await response.text())
        seen = await deferToThread(visit, daemon.url, Path(self.mktemp() + ".png"))
        bars = {key: (tokens, height) for key, tokens, height in seen["bars"]}
        self.assertEqual({key: tokens for key, (tokens, _) in bars.items()}, {"alice": 6, "bob": 2})
        self.assertAlmostEqual(bars["alice"][1] / bars["bob"][1], 3, places=3)
        self.assertEqual(seen["legend"].split(), ["alice", "bob"])
        self.assertEqual(
            [row[1:6] for row in seen["rows"]],
            [["alice", MODEL, "3", "3", "3"], ["bob", MODEL, "1", "1", "1"]],
        )

    async def test_usage_view_without_named_keys_says_how_to_keep_usage(self) -> None:
        daemon = InProcessDaemon(write_config(short_home(self), ""))
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        seen = await deferToThread(visit_unkeyed, daemon.url)
        self.assertIn("named keys", seen["notice"])
        self.assertEqual(seen["status"], "")
