"""Issue 35's A1 and A17 and issue 36's N1, as an attacker and a team member send them, kept as tests.

mrunner with real processes (tests/support/runner_program.py as the runner) and
named keys: C{alice} may use C{["hf.co/*", "ai/tiny:*"]} (the README's example),
C{bob} every model, C{root} is an admin. The store holds C{ai/tiny} and
C{ai/secret}.

- A1: alice asks for C{hf.co/anything@sha256:<digest of ai/secret>} (and the
  digest, the short id) on every inference route: each is refused, no runner
  starts, no runner sees a request.
- A17: alice asks about ai/secret: no listing, runner view or lookup shows it.
- N1: reading is not managing: alice and bob list what they may use, read their
  own usage, see their models' runners, and the page is told they are no admins.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from tests.support.daemon import http
from tests.support.daemon_cases import MODEL, CompatDaemonTestCase
from tests.support.ggufs import write_tiny_gguf
from tests.support.keyed import Keyed

SECRET = "ai/secret:latest"
KEYS = """
[http]
admin_api_keys = ["root-key"]
[keys.alice]
key = "alice-key"
models = ["hf.co/*", "ai/tiny:*"]
[keys.bob]
key = "bob-key"
[keys.root]
key = "root-key2"
admin = true
"""
HI = [{"role": "user", "content": "hi"}]
CHAT = {"messages": HI, "max_tokens": 3}
# Every inference route of every API, with a body it takes (the model is set per try).
ROUTES: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("/v1/chat/completions", CHAT, {}),
    ("/v1/completions", {"prompt": "hi"}, {}),
    ("/v1/embeddings", {"input": "hi"}, {}),
    ("/engines/v1/chat/completions", CHAT, {}),
    ("/engines/test/v1/chat/completions", CHAT, {}),
    ("/v1/chat/completions", CHAT, {"X-Preload-Only": "true"}),
    ("/anthropic/v1/messages", CHAT, {}),
    ("/v1/messages", CHAT, {}),
    ("/anthropic/v1/messages/count_tokens", {"messages": HI}, {}),
    ("/v1/responses", {"input": "hi"}, {}),
    ("/api/chat", {"messages": HI}, {}),
    ("/api/generate", {"prompt": "hi"}, {}),
    ("/api/embed", {"input": "hi"}, {}),
    ("/api/embeddings", {"prompt": "hi"}, {}),
]
MRUNNER = str(Path(sys.executable).with_name("mrunner"))


class HostileKeysTests(Keyed, CompatDaemonTestCase):
    async def start(self, text: str = "") -> None:
        await super().start(KEYS + text)
        gguf = self.home / "secret.gguf"
        write_tiny_gguf(gguf, seed=7)
        await self.daemon.import_model(SECRET, gguf)
        code, models = await self.ask("GET", "/models", "root-key")
        self.assertEqual(code, 200, models)
        self.ids = {model["tags"][0]: model["id"] for model in models}

    def starts(self) -> int:
        path = self.home / "starts"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def runner_saw(self) -> int:
        path = self.home / "requests"
        return len(path.read_text().splitlines()) if path.exists() else 0

    async def infer(self, key: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> int:
        response = await http.post(
            self.daemon.url + path,
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", **headers},
        )
        await response.text()
        return int(response.code)

    # A1

    async def test_a_glob_key_reaches_no_model_by_its_digest(self) -> None:
        """56 tries of issue 35 (4 spellings on 14 routes): each a 403 or 404, and no runner of ai/secret
        starts or sees anything; usage files none of them under a made-up name."""
        await self.start()
        digest = self.ids[SECRET]
        spellings = {
            f"hf.co/anything@{digest}": 404,
            f"hf.co/x/y:latest@{digest}": 404,
            digest: 403,
            digest.removeprefix("sha256:")[:12]: 403,
        }
        for name, status in spellings.items():
            for path, body, headers in ROUTES:
                code = await self.infer("alice-key", path, {**body, "model": name}, headers)
                self.assertEqual(code, status, f"{path} {headers} {name}")
        self.assertEqual((self.starts(), self.runner_saw()), (0, 0))
        code, usage = await self.ask("GET", "/engines/usage", "root-key")
        self.assertFalse([row for row in usage["data"] if row["model"].startswith("hf.co/")], usage)

    async def test_the_allowed_model_by_any_of_its_names(self) -> None:
        """What alice may use she reaches by name, by digest and by short id."""
        await self.start()
        digest = self.ids[MODEL]
        for name in ("ai/tiny", digest, digest.removeprefix("sha256:")[:12], f"ai/tiny@{digest}"):
            code = await self.infer("alice-key", "/v1/completions", {"model": name, "prompt": "hi"}, {})
            self.assertEqual(code, 200, name)

    # A17

    async def test_a_limited_key_sees_only_its_models(self) -> None:
        await self.start()
        for key in ("root-key", "bob-key"):  # both runners loaded
            for model in (MODEL, SECRET):
                await self.infer(key, "/v1/completions", {"model": model, "prompt": "hi"}, {})

        code, listed = await self.ask("GET", "/v1/models", "alice-key")
        self.assertEqual([entry["id"] for entry in listed["data"]], [MODEL])
        code, tags = await self.ask("GET", "/api/tags", "alice-key")
        self.assertEqual([entry["name"] for entry in tags["models"]], [MODEL])
        code, ps = await self.ask("GET", "/api/ps", "alice-key")
        self.assertEqual([entry["name"] for entry in ps["models"]], [MODEL])
        code, runners = await self.ask("GET", "/engines/ps", "alice-key")
        self.assertEqual([runner["model_name"] for runner in runners], [MODEL])
        code, overview = await self.ask("GET", "/engines/overview", "alice-key")
        self.assertEqual([runner["model_name"] for runner in overview["runners"]], [MODEL])
        digest = self.ids[SECRET]
        # What each asks by, and what its refusal must not tell: the digest of a name, the name of a digest.
        for method, path, body, untold in [
            ("GET", "/v1/models/ai/secret", None, digest[7:19]),
            ("GET", f"/v1/models/{digest}", None, "secret"),
            ("POST", "/api/show", {"model": "ai/secret"}, digest[7:19]),
            ("POST", "/api/show", {"model": digest[7:19]}, "secret"),
            ("GET", "/models/ai/secret", None, digest[7:19]),
            ("GET", f"/models/{digest}", None, "secret"),
        ]:
            code, answer = await self.ask(method, path, "alice-key", body)
            self.assertEqual(code, 403, (path, answer))
            self.assertNotIn(untold, json.dumps(answer))
        code, answer = await self.ask("POST", "/v1/completions", "alice-key", {"model": "ai/secre"})
        self.assertEqual(code, 403, answer)  # as for a stored model: no probing, no "did you mean"
        code, answer = await self.ask("POST", "/api/show", "alice-key", {"model": "ai/tiny"})
        self.assertEqual(code, 200, answer)

        # A key without a list (bob) and an admin see both.
        for key in ("bob-key", "root-key"):
            code, runners = await self.ask("GET", "/engines/ps", key)
            self.assertEqual(sorted(runner["model_name"] for runner in runners), [SECRET, MODEL], key)

    # N1

    async def test_reading_is_not_managing(self) -> None:
        """A normal key lists its models and reads its own usage, over HTTP and with the CLI; it still
        cannot manage (pull, delete, unload, records)."""
        await self.start()
        await self.infer("alice-key", "/v1/completions", {"model": MODEL, "prompt": "hi"}, {})
        await self.infer("bob-key", "/v1/completions", {"model": SECRET, "prompt": "hi"}, {})

        code, models = await self.ask("GET", "/models", "alice-key")
        self.assertEqual((code, [model["tags"] for model in models]), (200, [[MODEL]]))
        code, models = await self.ask("GET", "/models", "bob-key")
        self.assertEqual(sorted(model["tags"][0] for model in models), [SECRET, MODEL])
        code, usage = await self.ask("GET", "/engines/usage", "alice-key")
        self.assertEqual((code, {row["key"] for row in usage["data"]}), (200, {"alice"}))
        code, refused = await self.ask("GET", "/engines/usage?key=bob", "alice-key")
        self.assertEqual((code, refused["error"]["code"]), (403, "usage_of_another_key"))
        code, usage = await self.ask("GET", "/engines/usage", "root-key")
        self.assertEqual({row["key"] for row in usage["data"]}, {"alice", "bob"})
        code, overview = await self.ask("GET", "/engines/overview", "alice-key")
        self.assertEqual((overview["key"], overview["admin"]), ("alice", False))
        await self.own_metrics_and_disk()
        code, overview = await self.ask("GET", "/engines/overview", "root-key2")
        self.assertEqual((overview["key"], overview["admin"]), ("root", True))

        for method, path in [
            ("POST", "/models/create"),
            ("DELETE", "/models/ai/tiny"),
            ("POST", "/engines/unload"),
            ("GET", "/engines/requests"),
            ("GET", "/logs"),
        ]:
            code, answer = await self.ask(method, path, "alice-key", {"from": "ai/x"})
            self.assertEqual((code, answer["error"]["code"]), (403, "admin_key_required"), path)

        env = {**os.environ, "MRUNNER_HOST": self.daemon.url, "MRUNNER_API_KEY": "alice-key"}
        for args in (["ls"], ["usage"], ["ps"]):
            out, err, code = await getProcessOutputAndValue(MRUNNER, args, env=env, reactor=reactor)
            self.assertEqual(code, 0, (args, err))
            self.assertNotIn(b"secret", out, args)
        out, err, code = await getProcessOutputAndValue(MRUNNER, ["ls"], env=env, reactor=reactor)
        self.assertIn(b"ai/tiny", out)
        # Issue 53 N8: told before the upload, not after it.
        package = ["package", "--gguf", str(self.home / "secret.gguf"), "ai/mine"]
        for key, said in [("alice-key", b"key 'alice' may not add models"), ("wrong", b"--api-key KEY")]:
            out, err, code = await getProcessOutputAndValue(
                MRUNNER, package, env={**env, "MRUNNER_API_KEY": key}, reactor=reactor
            )
            self.assertEqual(code, 1, err)
            self.assertIn(said, err)
            self.assertNotIn(b"upload", out + err)

    async def own_metrics_and_disk(self) -> None:
        """Issue 53, N4 and N13: alice's /metrics has her series, not bob's; her df, not ai/secret's bytes."""
        code, metrics = await self.ask("GET", "/metrics", "alice-key")
        self.assertEqual(code, 200, metrics)
        self.assertIn('mrunner_key_requests_total{key="alice",status="200"} 1.0', metrics)
        self.assertIn("mrunner_queue_waiting", metrics)
        self.assertNotIn("bob", metrics)
        code, metrics = await self.ask("GET", "/metrics", "root-key")
        self.assertIn('key="bob"', metrics)
        code, alice = await self.ask("GET", "/engines/df", "alice-key")
        code, root = await self.ask("GET", "/engines/df", "root-key")
        secret = os.path.getsize(self.home / "secret.gguf")
        self.assertGreater(alice["models_disk_usage"], 0)
        self.assertLessEqual(alice["models_disk_usage"] + secret, root["models_disk_usage"])
