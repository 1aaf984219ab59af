"""The web page with API keys on, in headless Chromium: it asks for a key and keeps it in the tab.

No runner is needed: the page's files load without a key (a navigation cannot carry one), its
first API call answers 401, a wrong key is said to be refused and asked for again, and the right
one then reaches every route, admin ones included. The Models table has a row, and a Delete, per
name of a model.
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

KEY = "sk-page-key"
NAMES = ("ai/tiny:latest", "localhost:5000/ai/tiny:latest")


def visit(base: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with chromium_page() as page:
        page.goto(base + "/")
        seen["url"] = page.url
        page.wait_for_selector("#key-form:not([hidden])")
        seen["refused_at_first"] = page.is_visible("#key-refused")
        page.fill("#key-input", "sk-wrong")
        page.click("#key-form button")
        page.wait_for_selector("#key-refused:not([hidden])")
        page.wait_for_selector("#key-form:not([hidden])")
        seen["status_after_wrong_key"] = page.inner_text("#status")
        seen["no_runners_shown"] = page.is_visible("#no-runners")
        page.fill("#key-input", KEY)
        page.click("#key-form button")
        for name in NAMES:  # GET /models is an admin route
            page.wait_for_selector(f'#model-rows tr[data-model="{name}"]')
        page.wait_for_function("() => document.getElementById('summary').textContent.includes('loaded')")
        seen["stored"] = page.evaluate("() => sessionStorage.getItem('mrunner-key')")
        seen["form_hidden"] = page.is_hidden("#key-form")
        seen["status"] = page.inner_text("#status")
        page.once("dialog", lambda dialog: (seen.__setitem__("confirm", dialog.message), dialog.accept()))
        page.click(f'#model-rows tr[data-model="{NAMES[1]}"] button')
        page.wait_for_selector(f'#model-rows tr[data-model="{NAMES[1]}"]', state="detached")
        seen["rows"] = page.eval_on_selector_all("#model-rows tr", "rows => rows.map(r => r.dataset.model)")
    return seen


class PageKeyTests(TestCase):
    timeout = 120
    skip = None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: apt-get install chromium"

    async def test_a_wrong_key_is_refused_the_right_one_kept_and_every_name_listed(self) -> None:
        home = short_home(self)
        daemon = InProcessDaemon(write_config(home, f'[http]\napi_keys = ["{KEY}"]\n'))
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        gguf = home / "tiny.gguf"
        write_tiny_gguf(gguf)
        await daemon.import_model(NAMES[0], gguf)
        response = await http.post(
            f"{daemon.url}/models/{NAMES[0]}/tag",
            params={"repo": "localhost:5000/ai/tiny", "tag": "latest"},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        self.assertEqual(response.code, 201, await response.text())
        seen = await deferToThread(visit, daemon.url)
        self.assertEqual(seen["url"], daemon.url + "/ui")
        self.assertFalse(seen["refused_at_first"])
        self.assertEqual(seen["status_after_wrong_key"], "the API key was refused")
        self.assertFalse(seen["no_runners_shown"], "not 'No runner is loaded' while no key is accepted")
        self.assertEqual(seen["stored"], KEY)
        self.assertTrue(seen["form_hidden"])
        self.assertEqual(seen["status"], "")
        self.assertIn(f"Remove the name {NAMES[1]}? The model stays as {NAMES[0]}.", seen["confirm"])
        self.assertEqual(seen["rows"], [NAMES[0]])
        response = await http.get(f"{daemon.url}/models", headers={"Authorization": f"Bearer {KEY}"})
        self.assertEqual([model["tags"] for model in await response.json()], [[NAMES[0]]], "the model stays")
