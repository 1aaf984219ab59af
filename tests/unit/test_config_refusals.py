"""tap.conf mistakes that once loaded and then misbehaved: refused at start and at reload, naming the key.

A named key that is also an admin key (issue 35 A18), aliases to a digest or an id and aliases that
normalise alike (A19), a C{key_env} that is not set (issue 36 N13).
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner import config as configuration
from mrunner.config import ConfigError
from mrunner.daemon.reload import Reloader
from mrunner.errors import Unprocessable

DIGEST = "sha256:" + "ab" * 32


class RefusalTests(SynchronousTestCase):
    def load(self, text: str, environ: dict[str, str] | None = None) -> configuration.Config:
        path = Path(self.mktemp())
        path.write_text(text)
        return configuration.load(path, environ=environ or {})

    def assertRefused(self, text: str, words: str, environ: dict[str, str] | None = None) -> None:
        with self.assertRaises(ConfigError, msg=text) as caught:
            self.load(text, environ)
        self.assertIn(words, str(caught.exception), text)

    def test_a_named_key_that_is_also_listed(self) -> None:
        """The front door finds the named key first: the listed key's rights would be lost."""
        for http, words in [
            ('admin_api_keys = ["root"]', "keys.ops: its key is also in [http] admin_api_keys"),
            ('api_keys = ["root"]', "keys.ops: its key is also in [http] api_keys"),
        ]:
            self.assertRefused(f'[http]\n{http}\n[keys.ops]\nkey = "root"\n', words)
        loaded = self.load('[keys.ops]\nkey_env = "OPS"\n', {"OPS": "k", "MRUNNER_API_KEY": "k"})
        self.assertEqual((loaded.keys["ops"].key, loaded.http.api_keys), ("k", ()), "issue 53 N8: it is ops")
        loaded = self.load('[keys.ops]\nkey = "k"\n', {"MRUNNER_API_KEY": "other"})
        self.assertEqual(loaded.http.api_keys, ("other",), "another key is added")
        loaded = self.load('[http]\nadmin_api_keys = ["root"]\n[keys.ops]\nkey = "other"\nadmin = true\n')
        self.assertEqual(loaded.keys["ops"].key, "other")

    def test_where_the_key_is_missing(self) -> None:
        """Each way of giving a key says what is wrong with that way."""
        empty = Path(self.mktemp())
        empty.write_text("\n")
        empty.chmod(0o600)
        for text, environ, words in [
            ('[keys.alice]\nkey_env = "ALICE_KEY"\n', {}, "keys.alice: key_env ALICE_KEY is not set"),
            ('[keys.alice]\nkey_env = "ALICE_KEY"\n', {"ALICE_KEY": " "}, "key_env ALICE_KEY is empty"),
            (f'[keys.alice]\nkey_file = "{empty}"\n', {}, f"keys.alice.key_file: {empty} is empty"),
            ("[keys.alice]\npriority = 'low'\n", {}, "keys.alice: give the key as key, key_file or key_env"),
        ]:
            self.assertRefused(text, words, environ)

    def test_alias_targets(self) -> None:
        """A digest or an id is kept as the store reads it, not made a name no model has."""
        short = DIGEST[7:19]
        loaded = self.load(f'[aliases]\nbig = "{DIGEST}"\nsmall = "{short}"\nnamed = "smollm2"\n')
        self.assertEqual(loaded.aliases, {"big": DIGEST, "small": short, "named": "ai/smollm2:latest"})
        for target in ["sha256:AB", "sha256:" + "AB" * 32]:
            self.assertRefused(f'[aliases]\nbig = "{target}"\n', "aliases.big: digest")

    def test_aliases_that_normalise_alike(self) -> None:
        for names in [("Foo", "foo"), ("foo", "ai/foo:latest")]:
            text = "[aliases]\n" + "".join(f'"{name}" = "smollm2"\n' for name in names)
            self.assertRefused(
                text, f"aliases.{names[1]}: {names[1]!r} and {names[0]!r} are one name (ai/foo:latest)"
            )


class ReloadRefusalTests(SynchronousTestCase):
    """At reload, the same mistakes are a 422 that names them, and the running config stays."""

    def test_refused(self) -> None:
        path = Path(self.mktemp())
        path.write_text('[http]\nadmin_api_keys = ["root"]\n')
        seen: list[configuration.Config] = []

        def read() -> configuration.Config:
            return configuration.load(path, environ={})

        reloader = Reloader(read, read(), [seen.append])
        for text, words in [
            (
                '[http]\nadmin_api_keys = ["root"]\n[keys.ops]\nkey = "root"\n',
                "also in [http] admin_api_keys",
            ),
            ('[aliases]\nFoo = "smollm2"\nfoo = "smollm2"\n', "are one name"),
            ('[keys.alice]\nkey_env = "ALICE_KEY"\n', "key_env ALICE_KEY is not set"),
        ]:
            path.write_text(text)
            error = self.assertRaises(Unprocessable, reloader.reload)
            self.assertIn(words, error.message)
            self.assertIn("nothing changed", error.message)
        self.assertEqual(seen, [])
