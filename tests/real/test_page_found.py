"""The page's "Found on this machine" list in headless Chromium (issue 52): other tools' models, imported.

An Ollama store and an LM Studio folder, laid out as those tools write them, each with a tiny
GGUF; a third Ollama model whose blob no longer matches its digest. An admin's page lists all
three, imports two by their Import buttons (the store's weights are the tool's files: same inode),
marks them as in the store, and says why the third was refused, leaving nothing of it behind.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.browser import CHROMIUM, chromium_page
from tests.support.daemon import InProcessDaemon, http, short_home, write_config
from tests.support.tool_folders import lmstudio_repo, ollama_blob_path, ollama_model

KEY = "root-key"
AUTH: dict[bytes | str, bytes | str] = {"Authorization": f"Bearer {KEY}"}
# ref → the store's name for it
IMPORTED = {
    "ollama:tiny:1b": "ollama.com/library/tiny:1b",
    "lmstudio:pub/tiny-GGUF:F32": "lmstudio/pub/tiny-gguf:F32",
}
LIAR = "ollama:liar:1b"


def found_row(ref: str) -> str:
    return f'#found-rows tr[data-ref="{ref}"]'


def import_by_click(base: str, shots: Path) -> dict[str, Any]:
    """Import each of IMPORTED and then LIAR by its button; what the page showed."""
    seen: dict[str, Any] = {"errors": []}
    with chromium_page(viewport={"width": 1280, "height": 860}) as page:
        page.on("pageerror", lambda error: seen["errors"].append(str(error)))
        page.add_init_script(f"sessionStorage.setItem('mrunner-key', {KEY!r})")
        page.goto(base + "/ui")
        for ref in (*IMPORTED, LIAR):
            page.wait_for_selector(f"{found_row(ref)} button", state="visible")
        seen["listed"] = page.eval_on_selector_all("#found-rows tr", "rows => rows.map(r => r.textContent)")
        page.screenshot(path=str(shots / "found.png"), full_page=True)
        for ref, name in IMPORTED.items():
            page.click(f"{found_row(ref)} button")
            page.wait_for_selector(f'#model-rows tr[data-model="{name}"]')
            page.wait_for_selector(f'{found_row(ref)}[data-in-store="{name}"]')
            seen[ref] = page.inner_text("#found-status")
            seen[f"{ref} row"] = page.inner_text(found_row(ref))
        page.click(f"{found_row(LIAR)} button")
        page.wait_for_selector("#found-status.failed")
        seen["refused"] = page.inner_text("#found-status")
        page.wait_for_selector(f"{found_row(LIAR)} button:not([disabled])")
        page.screenshot(path=str(shots / "imported.png"), full_page=True)
        seen["status"] = page.inner_text("#status")
    return seen


class FoundPageTests(TestCase):
    timeout = 120
    skip = None if os.path.exists(CHROMIUM) else f"{CHROMIUM} is missing: apt-get install chromium"

    async def test_found_models_imported_from_the_page_without_a_copy(self) -> None:
        home = short_home(self)
        tools = home / "tools"
        ollama, lmstudio = tools / "ollama", tools / "lmstudio"
        ggufs = {name: tools / name / "tiny-F32.gguf" for name in ("o", "l", "liar")}
        for seed, path in enumerate(ggufs.values()):
            path.parent.mkdir(parents=True)
            write_tiny_llama(path, seed=seed)
        ollama_model(ollama, "tiny", "1b", ggufs["o"])
        ollama_model(ollama, "liar", "1b", ggufs["liar"])
        write_tiny_llama(ollama_blob_path(ollama, ggufs["liar"].read_bytes()), seed=7)
        lmstudio_repo(lmstudio, "pub/tiny-GGUF", {"tiny-F32.gguf": ggufs["l"]})
        sources = {
            "ollama:tiny:1b": ollama_blob_path(ollama, ggufs["o"].read_bytes()),
            "lmstudio:pub/tiny-GGUF:F32": lmstudio / "pub" / "tiny-GGUF" / "tiny-F32.gguf",
        }
        config = (
            f'[http]\nadmin_api_keys = ["{KEY}"]\n'
            f'[sources]\nollama = "{ollama}"\nlmstudio = "{lmstudio}"\nhuggingface = ""\nllamacpp = ""\n'
        )
        daemon = InProcessDaemon(write_config(home, config))
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))

        seen = await deferToThread(import_by_click, daemon.url, Path(self.mktemp()).absolute())

        self.assertEqual((seen["errors"], seen["status"]), ([], ""))
        listed = " ".join(seen["listed"])
        for ref in (*IMPORTED, LIAR):
            self.assertIn(ref.partition(":")[0], listed)
        self.assertIn("F32", listed)
        blobs = home / "models" / "blobs" / "sha256"
        for ref, name in IMPORTED.items():
            said = rf"^imported {re.escape(ref)} as {re.escape(name)}: linked \d file\(s\) \(no copy\)"
            self.assertRegex(seen[ref], said)
            self.assertIn(f"as {name}", seen[f"{ref} row"])
            inode = os.stat(sources[ref]).st_ino
            linked = [p for p in blobs.iterdir() if os.stat(p).st_ino == inode]
            self.assertEqual(len(linked), 1, "the store's weights are the tool's file, not a copy")
        self.assertIn("the GGUF's own chat template is used", seen["ollama:tiny:1b"])
        self.assertIn(f"import of {LIAR} failed", seen["refused"])
        self.assertIn("hashes to", seen["refused"])
        response = await http.get(daemon.url + "/models", headers=AUTH)
        stored = json.loads(await response.text())
        self.assertEqual(sorted(tag for model in stored for tag in model["tags"]), sorted(IMPORTED.values()))
