"""Issue 36's N3: the name a model is shown by, in an answer (the one asked) and where no request is in view.

L{Renamed} gives a runner's answer the name the request asked for, however the
runner's pieces cut it; L{Model.name} is the one stable name of a model with
several (its first on the default registry).
"""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from mrunner.proxy.connection import BodyReceiver
from mrunner.proxy.rename import Renaming, renaming
from mrunner.values.model import Model

RUNNER, ASKED = "localhost:5000/ai/smollm2:latest", "ai/smollm2:latest"
CHUNK = b'data: {"object":"chunk","model":"localhost:5000/ai/smollm2:latest","choices":[]}\n\n'
RENAMED = CHUNK.replace(RUNNER.encode(), ASKED.encode())


class Recording(BodyReceiver):
    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.ended: str | None = None

    def write(self, data: bytes) -> None:
        self.pieces.append(data)

    def end(self) -> None:
        self.ended = "end"

    def cut(self, why: str, between_chunks: bool) -> None:
        self.ended = f"cut: {why}"

    @property
    def body(self) -> bytes:
        return b"".join(self.pieces)


def relayed(pieces: list[bytes], end: bool = True) -> Recording:
    inner = Recording()
    renamed = Renaming(RUNNER, ASKED).around(inner)
    for piece in pieces:
        renamed.write(piece)
    if end:
        renamed.end()
    return inner


class RenamedTests(SynchronousTestCase):
    def test_each_event_as_it_comes(self) -> None:
        """A whole event goes on at once, renamed: nothing of it is held back."""
        inner = relayed([CHUNK, CHUNK], end=False)
        self.assertEqual(inner.pieces, [RENAMED, RENAMED])

    def test_cut_at_every_byte(self) -> None:
        body = CHUNK * 3
        for at in range(len(body)):
            self.assertEqual(relayed([body[:at], body[at:]]).body, RENAMED * 3, at)

    @given(st.lists(st.integers(0, 3 * len(CHUNK)), max_size=8))
    def test_any_pieces(self, cuts: list[int]) -> None:
        body = b'{"model": "localhost:5000/ai/smollm2:latest", "x": "\\"' + CHUNK * 2 + b'"'
        points = sorted({0, len(body), *(min(c, len(body)) for c in cuts)})
        pieces = [body[a:b] for a, b in itertools.pairwise(points)]
        self.assertEqual(relayed(pieces).body, body.replace(RUNNER.encode(), ASKED.encode()))

    def test_only_the_whole_string(self) -> None:
        """The model's text, where the name is escaped or a part of a longer string, is left as it is."""
        text = b'{"content":"say \\"localhost:5000/ai/smollm2:latest\\"",'
        text += b'"x":"localhost:5000/ai/smollm2:latest2"}'
        self.assertEqual(relayed([text]).body, text)

    def test_what_is_held_goes_before_a_cut(self) -> None:
        inner = Recording()
        renamed = Renaming(RUNNER, ASKED).around(inner)
        renamed.write(b'data: {"model":"local')
        renamed.cut("gone", True)
        self.assertEqual((inner.body, inner.ended), (b'data: {"model":"local', "cut: gone"))

    def test_renaming_only_where_the_names_differ(self) -> None:
        self.assertIsNone(renaming(RUNNER, RUNNER))
        self.assertIsNone(renaming(RUNNER, None))
        self.assertEqual(renaming(RUNNER, ASKED), Renaming(RUNNER, ASKED))


def model(*tags: str) -> Model:
    return Model(id="sha256:" + "ab" * 32, tags=tags, created=0, config={}, gguf="")


class ModelNameTests(SynchronousTestCase):
    def test_the_default_registry_first(self) -> None:
        self.assertEqual(model(RUNNER, ASKED).name, ASKED)
        self.assertEqual(model("hf.co/org/repo:Q4", "ai/repo:latest").name, "ai/repo:latest")
        self.assertEqual(model("ai/b:latest", "ai/a:latest").name, "ai/b:latest")

    def test_else_the_first_tag_or_the_id(self) -> None:
        self.assertEqual(model(RUNNER, "hf.co/org/repo:Q4").name, RUNNER)
        self.assertEqual(model().name, "abababababab")
