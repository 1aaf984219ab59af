"""Model references normalise as Docker Model Runner's do; hostile names are 400s."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import BadRequest
from mrunner.names import parse, with_tag
from mrunner.values.model import Reference

DIGEST = "sha256:" + "ab" * 32


class NormaliseTests(SynchronousTestCase):
    def assertNormal(self, name: str, expected: str) -> None:
        self.assertEqual(str(parse(name)), expected)

    def test_bare_name(self) -> None:
        self.assertNormal("smollm2", "ai/smollm2:latest")

    def test_namespace(self) -> None:
        self.assertNormal("myorg/model", "myorg/model:latest")

    def test_tag_kept(self) -> None:
        self.assertNormal("ai/smollm2:360M-Q4_K_M", "ai/smollm2:360M-Q4_K_M")

    def test_repository_lowercased_tag_not(self) -> None:
        self.assertNormal("AI/SmolLM2:Q4", "ai/smollm2:Q4")

    def test_registry_with_port(self) -> None:
        self.assertEqual(
            parse("registry.example:5000/ns/repo:tag"),
            Reference("registry.example:5000", "ns/repo", "tag"),
        )

    def test_registry_without_namespace_gets_none(self) -> None:
        self.assertNormal("localhost:5000/repo", "localhost:5000/repo:latest")

    def test_docker_hub_is_the_default_registry(self) -> None:
        for name in ("docker.io/ai/smollm2", "index.docker.io/ai/smollm2:latest"):
            self.assertNormal(name, "ai/smollm2:latest")

    def test_ollama_names_as_ollama_reads_them(self) -> None:
        for name in (
            "ollama.com/llama3.2:1b",
            "registry.ollama.ai/library/llama3.2:1b",
            "Ollama.com/Llama3.2:1b",
        ):
            self.assertNormal(name, "ollama.com/library/llama3.2:1b")
        self.assertNormal("registry.ollama.ai/me/model", "ollama.com/me/model:latest")

    def test_digest_reference(self) -> None:
        ref = parse(f"ai/smollm2@{DIGEST}")
        self.assertEqual((ref.tag, ref.digest, str(ref)), (None, DIGEST, f"ai/smollm2@{DIGEST}"))

    def test_with_tag(self) -> None:
        self.assertEqual(str(with_tag(parse(f"x@{DIGEST}"), "v2")), "ai/x:v2")


class HostileNameTests(SynchronousTestCase):
    def assertRejected(self, name: object, fragment: str) -> None:
        error = self.assertRaises(BadRequest, parse, name)
        self.assertIn(fragment, error.message)
        self.assertEqual(error.status, 400)

    def test_traversal(self) -> None:
        for name in ("../../etc/passwd", "ai/../x", "./x", "ai//x", "/abs"):
            self.assertRejected(name, "not a valid")

    def test_nul_and_control(self) -> None:
        for name in ("ai/x\x00", "ai/x\n", "a\x1bb", "a b", "x\x7f"):
            self.assertRejected(name, "control characters")

    def test_too_long(self) -> None:
        self.assertRejected("a" * 10_000, "longer than")

    def test_empty_and_not_a_string(self) -> None:
        self.assertRejected("", "non-empty string")
        self.assertRejected(None, "non-empty string")
        self.assertRejected(["x"], "non-empty string")

    def test_bad_tag_and_digest(self) -> None:
        self.assertRejected("ai/x:-bad", "tag")
        self.assertRejected("ai/x@sha256:1234", "digest")
        self.assertRejected("ai/x@md5:" + "a" * 32, "digest")

    def test_bad_registry(self) -> None:
        self.assertRejected("bad_host.example/ns/x", "registry")

    @given(st.text(max_size=300))
    def test_any_text_is_a_reference_or_a_bad_request(self, text: str) -> None:
        try:
            ref = parse(text)
        except BadRequest:
            return
        for part in ref.repository.split("/"):
            self.assertNotIn(part, ("", ".", ".."))
        self.assertEqual(parse(str(ref)), ref)
