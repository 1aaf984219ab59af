"""How many tokens a request is at least, from its model's vocabulary alone (issue 49: a request no
context could hold is a 400 before any runner starts)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import attrs
import gguf
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.config import Config, SchedulerConfig
from mrunner.errors import ContextExceeded
from mrunner.scheduling.facade import Scheduler
from mrunner.store.gguf_header import HeaderError, read_strings
from mrunner.store.spelling import Spelling, _gpt2_bytes, _spm_bytes, fewest_tokens
from mrunner.testing.tinymodel import write_tiny_llama
from mrunner.values.backend import COMPLETION, EMBEDDING
from mrunner.values.request import Resolved
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model

#: "abc" is no piece a tokenizer can make: neither "ab" + "c" nor "a" + "bc" are both pieces.
SPELLING = Spelling.of([b"a", b"b", b" ", b"ab", b" ab", b"abab", b"abc"])


def least(text: bytes) -> int:
    """The fewest pieces of L{SPELLING}, each over every cut: what L{Spelling.fewest} finds faster."""
    if not text:
        return 0
    return min(
        1 + least(text[end:]) for end in range(1, len(text) + 1) if end == 1 or text[:end] in SPELLING.pieces
    )


class SpellingTests(SynchronousTestCase):
    def test_reachable_pieces_only(self) -> None:
        self.assertEqual(SPELLING.pieces, {b"a", b"b", b" ", b"ab", b" ab", b"abab"})
        self.assertEqual(SPELLING.fewest(b"abab ab", 100), 2)
        self.assertEqual(SPELLING.fewest(b"abc", 100), 2, "ab + c, c a byte of its own")

    @given(st.binary(max_size=24).map(lambda b: bytes(b"ab "[x % 3] for x in b)), st.integers(0, 30))
    def test_fewest_is_the_least_spelling(self, text: bytes, past: int) -> None:
        """Every cut tried; the walk stopped at C{past + 1} says no more than that."""
        self.assertEqual(SPELLING.fewest(text, past), min(least(text), past + 1))

    def test_pieces_as_bytes(self) -> None:
        self.assertEqual(_gpt2_bytes("Ġhello".encode()), b" hello")
        self.assertEqual(_gpt2_bytes("Ċ".encode()), b"\n")
        self.assertEqual(_gpt2_bytes("Ã©".encode()), "é".encode())
        self.assertEqual(_spm_bytes("▁the".encode()), b" the")
        self.assertEqual(_spm_bytes(b"<0x0A>"), b"\n")

    def test_the_tiny_model_as_llama_server_counts(self) -> None:
        """Its words are pieces no merge reaches: llama-server counts "the water " as ten tokens."""
        path = Path(self.mktemp())
        write_tiny_llama(path)
        self.assertEqual(fewest_tokens(str(path), ["the water " * 100], 10_000), 1000 - 2)
        self.assertEqual(fewest_tokens(str(path), ["the water " * 100, "x" * 20], 500), 501)

    def test_a_file_with_no_vocabulary(self) -> None:
        path = Path(self.mktemp())
        path.write_bytes(b"ggml" + b"\0" * 100)  # a whisper model's magic
        self.assertIsNone(fewest_tokens(str(path), ["text" * 1000], 10))

    def test_a_tokenizer_it_does_not_read(self) -> None:
        """WordPiece writes a word's later pieces as C{##ing}: a floor from them would count too many."""
        path = self.mktemp()
        writer = gguf.GGUFWriter(path, "bert")
        writer.add_tokenizer_model("bert")
        writer.add_token_list(["walk", "##ing", "w", "a", "l", "k", "i", "n", "g"])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        self.assertIsNone(fewest_tokens(path, ["walking " * 100], 10))

    def test_a_vocabulary_longer_than_its_file(self) -> None:
        header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
        key = b"tokenizer.ggml.tokens"
        entry = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 2**20)
        with self.assertRaises(HeaderError):
            read_strings(io.BytesIO(header + entry), len(header + entry), ("tokenizer.ggml.tokens",))


class RefusedBeforeALoadTests(SynchronousTestCase):
    """The scheduler refuses a completion its context cannot hold before a runner starts."""

    def setUp(self) -> None:
        self.store = FakeStore({"ai/a:latest": model("ai/a:latest")})
        self.spawn = FakeSpawner()
        config = Config(home=Path(self.mktemp()), scheduler=SchedulerConfig(max_runners=2, keep_alive=300))
        backend = FakeBackend(default_context=100)
        backends = {"llama.cpp": backend}
        self.scheduler = Scheduler(Clock(), config, backends, self.store, self.spawn.start_runner)
        self.scheduler.start()
        backend.installs[-1].callback("llama.cpp test")

    def ask(self, texts: tuple[str, ...], mode: str = COMPLETION) -> Resolved:
        return Resolved("llama.cpp", self.store.models["ai/a:latest"], mode, texts=lambda: texts)

    def test_too_long(self) -> None:
        self.store.tokens = 100
        asked = self.scheduler.acquire(self.ask(("x" * 60, "y" * 60)))
        failure = self.failureResultOf(asked, ContextExceeded)
        self.assertIn("(at least 100 tokens)", failure.value.message)
        self.assertIn("context of 100 tokens", failure.value.message)
        self.assertEqual(self.spawn.processes, [], "no runner started")

    def test_counted_only_where_it_may_not_fit(self) -> None:
        """Fewer bytes than the context, a floor under it, another mode: a load as always."""
        self.store.tokens = 100
        self.scheduler.acquire(self.ask(("x" * 99,)))
        self.store.tokens = 99
        self.scheduler.acquire(self.ask(("x" * 200,)))
        self.store.tokens = 1000
        self.scheduler.acquire(attrs.evolve(self.ask(("x" * 200,)), mode=EMBEDDING))
        self.assertEqual(len(self.spawn.processes), 2)
