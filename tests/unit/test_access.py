"""Which models a named key may use and see (L{mrunner.teams.access}), against a real store on disk.

Issue 35's A1: a key's list is matched against the model a name resolves to, never the
string sent, so C{hf.co/anything@sha256:<digest of ai/secret>} reaches nothing; A17: a key
learns nothing of the models it may not use, from a 403, a 404 or a listing.
"""

from __future__ import annotations

import os

import attrs

from mrunner.errors import Forbidden, NotFound
from mrunner.teams.access import (
    check_usable,
    may_use,
    visible,
    visible_disk_usage,
    visible_name,
    visible_runners,
)
from mrunner.teams.members import Member
from tests.support.metrics import snapshot
from tests.support.store_cases import StoreTestCase

#: The README's own example.
GLOB = Member("alice", models=("hf.co/*", "ai/tiny:*"))


class NameAtDigestTests(StoreTestCase):
    """A C{name@digest} finds a model only when the name is one of that model's names."""

    def test_its_own_name(self) -> None:
        model = self.import_model("ai/x:v1")
        for name in (f"ai/x@{model.id}", f"ai/x:v1@{model.id}", f"docker.io/ai/x@{model.id}"):
            self.assertEqual(self.store.resolve(name), model, name)

    def test_another_name(self) -> None:
        model = self.import_model("ai/secret")
        for name in (f"hf.co/anything@{model.id}", f"ai/secret:v2@{model.id}", f"ai/secre@{model.id}"):
            error = self.assertRaises(NotFound, self.store.resolve, name)
            self.assertIn("no model named", error.message)
        self.assertEqual(self.store.resolve(model.id), model)  # the digest alone still names it


class CheckUsableTests(StoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tiny = self.import_model("ai/tiny", seed=1)
        self.secret = self.import_model("ai/secret", seed=2)

    def refused(self, member: Member, name: str) -> Forbidden:
        error = self.assertRaises(Forbidden, check_usable, member, self.store, name)
        self.assertEqual(error.code, "model_not_allowed")
        return error

    def test_by_the_model_it_resolves_to(self) -> None:
        """Every spelling of ai/tiny passes; every spelling of ai/secret is the same 403."""
        for name in ("ai/tiny", "tiny", "ai/tiny:latest", self.tiny.id, self.tiny.short_id):
            check_usable(GLOB, self.store, name)
        for name in ("ai/secret", self.secret.id, self.secret.short_id, f"ai/secret@{self.secret.id}"):
            self.refused(GLOB, name)

    def test_a_made_up_name_at_a_digest_is_a_404(self) -> None:
        """A1: the name matches hf.co/*, but names no model with that digest."""
        made_up = f"hf.co/anything@{self.secret.id}"
        error = self.assertRaises(NotFound, check_usable, GLOB, self.store, made_up)
        self.assertNotIn("ai/secret", error.message)

    def test_missing_and_forbidden_look_alike(self) -> None:
        """A name outside the list is a 403 whether it is stored or not: no probing the store."""
        self.assertEqual(
            self.refused(GLOB, "ai/nothing").message.replace("ai/nothing", "X"),
            self.refused(GLOB, "ai/secret").message.replace("ai/secret", "X"),
        )
        self.refused(GLOB, "sha256:" + "0" * 64)

    def test_a_404_suggests_no_other_model(self) -> None:
        everything_ai = Member("bob", models=("ai/t*",))
        error = self.assertRaises(NotFound, check_usable, everything_ai, self.store, "ai/tin")
        self.assertNotIn("did you mean", error.message)
        error = self.assertRaises(NotFound, self.store.resolve, "ai/secre")
        self.assertIn("did you mean ai/secret:latest", error.message)  # what an unlimited key is told

    def test_any_name_of_the_model(self) -> None:
        """A model the admin also named ai/tiny:v2 is usable by its other names and its digest."""
        self.store.tag("ai/secret", "ai/tiny:v2")
        for name in ("ai/secret", self.secret.id, "ai/tiny:v2"):
            check_usable(GLOB, self.store, name)

    def test_keys_without_a_list_look_nothing_up(self) -> None:
        for member in (None, Member("carol")):
            check_usable(member, self.store, "ai/nothing")  # the scheduler says it is missing
            self.assertTrue(may_use(member, self.secret))

    def test_views(self) -> None:
        self.assertEqual(visible(GLOB, self.store.list()), [self.tiny])
        runners = [attrs.evolve(snapshot("x"), model_id=model.id) for model in (self.tiny, self.secret)]
        self.assertEqual([r.model_id for r in visible_runners(GLOB, self.store, runners)], [self.tiny.id])
        self.assertEqual(visible_runners(None, self.store, runners), runners)
        self.assertTrue(visible_name(GLOB, "tiny"))
        self.assertFalse(visible_name(GLOB, "ai/secret"))

    def test_disk_usage(self) -> None:
        """Issue 53, N13: a key's C{df} counts only the models it may use."""
        everything = self.store.disk_usage()
        self.assertEqual(visible_disk_usage(None, self.store), everything)
        self.assertEqual(visible_disk_usage(Member("carol"), self.store), everything)
        own = visible_disk_usage(GLOB, self.store)
        self.assertEqual(own, os.path.getsize(self.tiny.gguf))
        self.assertLess(own + os.path.getsize(self.secret.gguf), everything + 1)
