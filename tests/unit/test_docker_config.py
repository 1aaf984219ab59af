"""Docker's config.json read as Docker reads it: which helper, which entry, what a helper answers."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner import docker_config as dc
from mrunner.docker_config import Credential

HUB = dc.HUB_KEY


def auth(pair: str) -> str:
    return base64.b64encode(pair.encode()).decode()


class ReadingTests(SynchronousTestCase):
    def test_helper_for(self) -> None:
        config = {"credHelpers": {"r.test:5000": "pass", HUB: "hub"}, "credsStore": "secretservice"}
        self.assertEqual(dc.helper_for(config, "r.test:5000"), "pass")
        self.assertEqual(dc.helper_for(config, dc.HUB_HOSTS[0]), "hub", "Hub's hosts share its key")
        self.assertEqual(dc.helper_for(config, "other.test"), "secretservice")
        self.assertIsNone(dc.helper_for({}, "other.test"))

    def test_stored(self) -> None:
        cases = [
            ("base64 auth", {"r.test": {"auth": auth("u:p:q")}}, "r.test", Credential("u", "p:q")),
            ("a URL key", {"https://r.test/v1/": {"auth": auth("u:p")}}, "r.test", Credential("u", "p")),
            (
                "username, password",
                {"r.test": {"username": "u", "password": "p"}},
                "r.test",
                Credential("u", "p"),
            ),
            ("identity token", {"r.test": {"identitytoken": "t"}}, "r.test", Credential("", "t", token=True)),
            ("Hub's key", {HUB: {"auth": auth("u:p")}}, dc.HUB_HOSTS[1], Credential("u", "p")),
            ("a helper's placeholder", {"r.test": {}}, "r.test", None),
            ("another host", {"r.test": {"auth": auth("u:p")}}, "s.test", None),
        ]
        for why, auths, host, expected in cases:
            self.assertEqual(dc.stored({"auths": auths}, host), expected, why)

    def test_bad_auth(self) -> None:
        with self.assertRaises(dc.DockerConfigError) as caught:
            dc.stored({"auths": {"r.test": {"auth": "%%%"}}}, "r.test")
        self.assertNotIn("%%%", str(caught.exception))

    def test_secrets_never_in_repr(self) -> None:
        self.assertNotIn("hunter2", repr(Credential("alice", "hunter2")))
        self.assertNotIn("alice", repr(Credential("alice", "hunter2")))

    def test_helper_answer(self) -> None:
        self.assertEqual(dc.helper_answer(b'{"Username": "u", "Secret": "s"}'), Credential("u", "s"))
        token = dc.helper_answer(b'{"ServerURL": "x", "Username": "<token>", "Secret": "t"}')
        self.assertEqual(token, Credential("", "t", token=True))
        for bad in (b"nonsense", b'{"Username": 1, "Secret": "s"}', b"[]"):
            self.assertRaises(dc.DockerConfigError, dc.helper_answer, bad)
        self.assertTrue(dc.is_miss(b"credentials not found in native keychain\n"))

    def test_config_path(self) -> None:
        self.assertEqual(dc.config_path({"DOCKER_CONFIG": "/d"}), Path("/d/config.json"))
        self.assertEqual(dc.config_path({"HOME": "/h"}), Path("/h/.docker/config.json"))


class WritingTests(SynchronousTestCase):
    def test_login_and_logout_entries(self) -> None:
        config = {"auths": {"https://r.test/v1/": {"auth": auth("old:old")}}, "credsStore": ""}
        written = dc.with_auth(config, "r.test", Credential("u", "p"))
        self.assertEqual(written["auths"], {"r.test": {"auth": auth("u:p")}}, "the old key is replaced")
        self.assertEqual(dc.with_auth(config, "r.test", Credential("u", ""))["auths"], {"r.test": {}})
        self.assertEqual(dc.with_auth(written, "r.test", None)["auths"], {})
        self.assertEqual(written["credsStore"], "", "the rest of the file is kept")

    def test_write(self) -> None:
        path = Path(self.mktemp()) / "docker" / "config.json"
        dc.write(path, {"auths": {}})
        self.assertEqual(json.loads(path.read_text()), {"auths": {}})
        self.assertEqual(path.stat().st_mode & 0o777, 0o600)
        self.assertEqual(dc.read(path.with_name("absent.json")), {})

    def test_store_input(self) -> None:
        sent = json.loads(dc.helper_store_input(dc.HUB_HOSTS[0], Credential("u", "p")))
        self.assertEqual(sent, {"ServerURL": HUB, "Username": "u", "Secret": "p"})
