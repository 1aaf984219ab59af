"""The web page with a normal named key, in headless Chromium (issue 36, N1): reading is not managing.

alice may use C{ai/tiny:*}; the store also holds ai/secret, and both have runners.
Her page lists ai/tiny and its runner only, with no red error, and offers nothing
her key cannot do: no Pull, Delete or Unload, no Logs or Requests view. An
admin's page offers all of them.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.browser import CHROMIUM, chromium_page
from tests.support.daemon import InProcessDaemon, http, short_home, write_config
from tests.support.ggufs import write_tiny_gguf

TINY, SECRET = "ai/tiny:latest", "ai/secret:latest"
KEYS = """
[http]
admin_api_keys = ["root-key"]
[keys.alice]
key = "alice-key"
models = ["ai/tiny:*"]
"""
OFFERS = {
    "pull": "#pull-form",
    "delete": "#model-rows button",
    "unload": "#runner-rows button",
    "logs": '#tabs [data-view="logs"]',
    "requests": '#tabs [data-view="requests"]',
}


def visit(base: str, key: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with chromium_page() as page:
        page.add_init_script(f"sessionStorage.setItem('mrunner-key', {key!r})")
        page.goto(base + "/ui")
        page.wait_for_selector(f'#model-rows tr[data-model="{TINY}"]')
        page.wait_for_selector(f'#runner-rows tr[data-model="{TINY}"]')
        page.wait_for_function("() => document.getElementById('summary').textContent.includes('loaded')")
        seen["offers"] = sorted(name for name, selector in OFFERS.items() if page.is_visible(selector))
        page.click('#tabs [data-view="usage"]')
        page.wait_for_selector("#usage-rows tr")
        for view in ("model", "runner", "usage"):
            rows = page.eval_on_selector_all(f"#{view}-rows tr", "rows => rows.map(r => r.textContent)")
            seen[view] = " ".join(rows)
        seen["status"] = page.inner_text("#status")
    return seen


class ReaderPageTests(TestCase):
    timeout = 120
    skip = None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: apt-get install chromium"

    async def test_a_normal_key_sees_its_models_and_no_management(self) -> None:
        home = short_home(self)
        daemon = InProcessDaemon(write_config(home, KEYS))
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        for seed, name in enumerate((TINY, SECRET)):
            gguf = home / f"{seed}.gguf"
            write_tiny_gguf(gguf, seed=seed)
            await daemon.import_model(name, gguf)
        for key, name in (("root-key", SECRET), ("alice-key", TINY)):
            response = await http.post(
                daemon.url + "/v1/completions",
                json={"model": name, "prompt": "hi"},
                headers={"Authorization": f"Bearer {key}"},
            )
            self.assertEqual(response.code, 200, await response.text())

        alice = await deferToThread(visit, daemon.url, "alice-key")
        for view in ("model", "runner", "usage"):
            self.assertIn("ai/tiny", alice[view])
            self.assertNotIn("secret", alice[view])
        self.assertEqual((alice["status"], alice["offers"]), ("", []))

        root = await deferToThread(visit, daemon.url, "root-key")
        self.assertIn("secret", root["runner"])
        self.assertEqual(root["offers"], sorted(OFFERS))
