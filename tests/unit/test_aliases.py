"""Aliases: the pure name resolution, the config table, and what the model lists show."""

from __future__ import annotations

from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from mrunner import config
from mrunner.api.aliases import Aliases, stored_name
from mrunner.config.tables import build
from mrunner.errors import NotFound
from tests.support.fakes import FakeStore, model

SMOL = "ai/smollm2:latest"
ALIASES = {"ai/gpt-4o-mini:latest": SMOL}


class StoredNameTests(SynchronousTestCase):
    """L{stored_name}: a table of (what the request names, what the store has, what is looked up)."""

    CASES = [
        ("an alias", "gpt-4o-mini", [SMOL], SMOL),
        ("an alias, normalised", "ai/gpt-4o-mini:latest", [SMOL], SMOL),
        ("a stored name", "smollm2", [SMOL], "smollm2"),
        ("a stored model shadows the alias", "gpt-4o-mini", [SMOL, "ai/gpt-4o-mini:latest"], "gpt-4o-mini"),
        ("an unknown name stays as it is", "other", [SMOL], "other"),
        ("an invalid name stays as it is (its 400 follows)", "Not A Name!", [SMOL], "Not A Name!"),
        ("another tag is not the alias", "gpt-4o-mini:v2", [SMOL], "gpt-4o-mini:v2"),
    ]

    def test_cases(self) -> None:
        for why, name, stored, expected in self.CASES:
            store = FakeStore({n: model(n, str(i) * 64) for i, n in enumerate(stored)})
            self.assertEqual(stored_name(name, ALIASES, store), expected, why)

    def test_no_aliases(self) -> None:
        self.assertEqual(stored_name("gpt-4o-mini", {}, FakeStore()), "gpt-4o-mini")

    def test_target_missing(self) -> None:
        """The client never wrote the target: the 404 names the alias and where it points."""
        error = self.assertRaises(NotFound, stored_name, "gpt-4o-mini", ALIASES, FakeStore())
        self.assertEqual(
            error.message,
            f"alias gpt-4o-mini points to {SMOL}, which is not in the store;"
            " pull it (POST /models/create) or change [aliases]",
        )
        self.assertEqual(error.code, "model_not_found")


class ConfigTests(SynchronousTestCase):
    def test_table(self) -> None:
        loaded = build({"aliases": {"gpt-4o-mini": "smollm2", "claude": "ai/qwen3:8B"}})
        self.assertEqual(loaded.aliases, {"gpt-4o-mini": SMOL, "claude": "ai/qwen3:8B"})

    def test_refused(self) -> None:
        for table, words in [
            ({"a": 1}, "aliases.a: expected a model name"),
            ({"a": "Bad Name"}, "aliases.a: model name 'Bad Name'"),
            ({"Bad Name": "smollm2"}, "aliases.Bad Name: alias"),
            ({"a": "b", "b": "smollm2"}, "aliases.a: ai/b:latest is itself an alias"),
            ("x", "aliases: expected a table"),
        ]:
            with self.assertRaises(config.ConfigError) as caught:
                build({"aliases": table})
            self.assertIn(words, str(caught.exception), table)


class AliasesTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events: list[dict[str, object]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def warnings(self) -> list[str]:
        return [formatEvent(e) for e in self.events if e.get("log_level") == LogLevel.warn and "alias" in e]

    def test_listed(self) -> None:
        """Only aliases that work are listed: the target stored, the name not."""
        smol, shadow = model(SMOL, "1" * 64), model("ai/shadow:latest", "2" * 64)
        store = FakeStore({SMOL: smol, shadow.name: shadow})
        aliases = Aliases({"gpt-4o-mini": SMOL, "missing": "ai/gone:latest", "shadow": SMOL}, store)
        self.assertEqual(aliases.listed(), [("gpt-4o-mini", smol)])
        self.assertEqual(
            self.warnings(),
            [
                "alias missing points to ai/gone:latest, which is not in the store: requests for it get 404"
                " until it is pulled; pull it or change [aliases]",
                "alias shadow is not used: a stored model has that name, and a stored model wins;"
                " rename the alias in [aliases] or remove the model",
            ],
            "a missing target and a shadowed alias are told at start",
        )

    def test_reconfigure(self) -> None:
        store = FakeStore({SMOL: model(SMOL), "ai/x:latest": model("ai/x:latest")})
        aliases = Aliases({}, store)
        aliases.configure(build({"aliases": {"gpt-4o-mini": "ai/x", "smollm2": "ai/x", "y": "ai/z"}}))
        self.assertEqual(
            aliases.table,
            {"ai/gpt-4o-mini:latest": "ai/x:latest", SMOL: "ai/x:latest", "ai/y:latest": "ai/z:latest"},
        )
        self.assertEqual(
            [w.split(" ", 2)[1] for w in self.warnings()], ["smollm2", "y"], "and at each reload"
        )
