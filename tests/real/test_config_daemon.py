"""tap.conf mistakes as a user meets them on a real daemon (issue 35 A18, A19; issue 36 N7).

The daemon is real, the runner the stand-in (tests/support/runner_program.py): aliases to a digest
and to an id are served, an alias to a missing model is a 404 that says where it points, a named key
that is also an admin key is refused by a reload (the old config kept) and at start (one line, exit 1).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.trial.unittest import TestCase

from tests.support.daemon import http, short_home, spawn_twistd, stop_twistd, write_config
from tests.support.daemon_cases import MODEL, CompatDaemonTestCase

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
MISSING = '[aliases]\n"gpt-4o-mini" = "ai/gone"\n'
ROOT = {"Authorization": "Bearer root"}


class ConfigDaemonTests(CompatDaemonTestCase):
    def watch_log(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        return events

    def reconfigure(self, text: str) -> None:
        conf = self.daemon.config_path
        conf.write_text(conf.read_text().replace("\n[backends", f"\n{text}\n[backends", 1))

    async def test_alias_targets_a_digest_and_an_id(self) -> None:
        await self.start()
        self.open_gates(10)
        response = await http.get(f"{self.daemon.url}/models/{MODEL}")
        digest = (await response.json())["id"]
        self.reconfigure(f'[aliases]\nby-digest = "{digest}"\nby-id = "{digest[7:19]}"\n')
        code, reloaded = await self.post("/engines/_reload", {})
        self.assertEqual(code, 200, reloaded)
        for alias in ("by-digest", "by-id"):
            code, answer = await self.post("/v1/chat/completions", {"model": alias, **CHAT})
            self.assertEqual(code, 200, answer)
        (runner,) = self.daemon.scheduler.snapshot()
        self.assertEqual(
            (runner.model_name, len(self.sent_to_runner())), (MODEL, 2), "one runner served both"
        )
        listed = [m["id"] for m in (await (await http.get(self.daemon.url + "/v1/models")).json())["data"]]
        self.assertEqual(sorted(set(listed) - {MODEL}), ["by-digest", "by-id"])

    async def test_alias_to_a_missing_model(self) -> None:
        """Told at start and at reload; the 404 names the alias and where it points, on each API."""
        events = self.watch_log()
        await self.start(MISSING)
        said = "alias gpt-4o-mini points to ai/gone:latest, which is not in the store"
        warned = [formatEvent(e) for e in events if e.get("log_level") == LogLevel.warn]
        self.assertEqual(
            [w for w in warned if said in w],
            [f"{said}: requests for it get 404 until it is pulled; pull it or change [aliases]"],
        )
        for path, body in [
            ("/v1/chat/completions", CHAT),
            ("/anthropic/v1/messages", {"max_tokens": 5, "messages": []}),
            ("/api/chat", {"messages": []}),
        ]:
            code, answer = await self.post(path, {"model": "gpt-4o-mini", **body})
            self.assertEqual(code, 404, answer)
            self.assertIn(said, str(answer), path)
        del events[:]
        code, _ = await self.post("/engines/_reload", {})
        self.assertEqual(code, 200)
        self.assertTrue([e for e in events if said in formatEvent(e)], "told again at reload")

    async def test_reload_refuses_a_named_admin_key(self) -> None:
        """The admin key would have lost admin to the named key: the reload is refused, nothing changes."""
        await self.start('[http]\nadmin_api_keys = ["root"]\n')
        self.reconfigure('[keys.ops]\nkey = "root"\n')
        code, answer = await self.post("/engines/_reload", {}, ROOT)
        self.assertEqual(code, 422, answer)
        self.assertIn("keys.ops: its key is also in [http] admin_api_keys", answer["error"]["message"])
        self.assertIn("nothing changed", answer["error"]["message"])
        code, answer = await self.post("/engines/_reload", {}, ROOT)
        self.assertEqual(code, 422, "still an admin: the reload route answers, and refuses again")


class ConfigStartTests(TestCase):
    timeout = 30

    async def test_start_refuses_a_named_admin_key(self) -> None:
        home = short_home(self)
        config = write_config(home, '[http]\nadmin_api_keys = ["root"]\n[keys.ops]\nkey = "root"\n')
        process = spawn_twistd(config, home)
        self.addCleanup(lambda: ensureDeferred(stop_twistd(process)))  # should it start after all
        await process.output.ended
        said = (home / "twistd.out").read_text().splitlines()
        self.assertEqual((process.output.exit_code, len(said)), (1, 1), said)
        self.assertTrue(
            said[0].startswith("mrunner: keys.ops: its key is also in [http] admin_api_keys"), said
        )
