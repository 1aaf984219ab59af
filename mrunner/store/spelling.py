"""At least how many tokens a model's tokenizer makes of a text, from its GGUF vocabulary alone.

A request longer than a model's context is refused by llama-server once a
runner has loaded (issue 49 asks for the 400 before any runner starts), and
no runner is there to tokenize it. Every tokenizer llama.cpp runs cuts a
text into pieces of its vocabulary, and a piece it can reach at all is a
single character or byte or two reachable pieces joined (BPE's merges and
SentencePiece's bigrams both build so): so the fewest reachable pieces
that spell the text is a floor under its count, whatever its pre-splitting
and merge order. Real vocabularies are learnt by those merges, and the floor
comes within a few percent of the count; a vocabulary whose long pieces are
unreachable (the tests' tiny one) is counted by the characters it uses.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import lru_cache

import attrs

from mrunner.store.gguf_header import HeaderError, read_strings

TOKENS = "tokenizer.ggml.tokens"
MODEL = "tokenizer.ggml.model"
#: SentencePiece's space, which its vocabularies hold in place of b" ".
SPM_SPACE = "\u2581"


@attrs.frozen
class Spelling:
    """The reachable pieces of a vocabulary as bytes, and every prefix of one, for the walk."""

    pieces: frozenset[bytes]
    prefixes: frozenset[bytes]
    longest: int

    @classmethod
    def of(cls, pieces: Iterable[bytes]) -> Spelling:
        reachable = _reachable(set(pieces))
        prefixes = {piece[:end] for piece in reachable for end in range(1, len(piece) + 1)}
        return cls(frozenset(reachable), frozenset(prefixes), max(map(len, reachable), default=1))

    def fewest(self, text: bytes, past: int) -> int:
        """The fewest pieces that spell C{text} (a byte with no piece of its own counts one), and
        C{past + 1} for any more, which the walk stops at once it is sure: it costs the context, not
        the text."""
        size, longest = len(text), self.longest
        best = [0] + [size + 1] * size
        for start in range(size):
            # Every spelling has a cut among the last `longest` places, whose counts are final.
            if start % longest == 0 and min(best[max(0, start - longest + 1) : start + 1]) > past:
                return past + 1
            count = best[start] + 1
            end = start + 1
            best[end] = min(best[end], count)  # the byte alone: its piece, a byte token or the unknown one
            while end <= size and text[start:end] in self.prefixes:
                if text[start:end] in self.pieces and count < best[end]:
                    best[end] = count
                end += 1
        return min(best[size], past + 1)


def fewest_tokens(path: str, texts: Iterable[str], past: int) -> int | None:
    """At least how many tokens the GGUF at C{path} makes of C{texts}, the parts of one request,
    up to C{past + 1}; None for a file with no vocabulary mrunner reads.

    Each part is counted alone, less two: the template around it may join a piece across its
    edges.
    """
    spelling = _spelling(path)
    if spelling is None:
        return None
    total = 0
    for text in texts:
        total += max(0, spelling.fewest(text.encode("utf-8"), past + 2) - 2)
        if total > past:
            return past + 1
    return total


def _spelling(path: str) -> Spelling | None:
    """The spelling of the vocabulary of C{path}, read for each count: it takes some 20 MB for
    SmolLM2's 49,152 pieces (0.2 s), which the daemon does not keep for a check this rare."""
    try:
        with open(path, "rb") as file:
            found = read_strings(file, os.fstat(file.fileno()).st_size, (MODEL, TOKENS))
    except (OSError, HeaderError):
        return None
    kind, tokens = found.get(MODEL), found.get(TOKENS)
    decode = DECODERS.get(kind[0] if kind else b"")
    if not tokens or decode is None:
        return None
    return Spelling.of(piece for piece in map(decode, tokens) if piece)


def _reachable(pieces: set[bytes]) -> set[bytes]:
    """The pieces a tokenizer can make: one byte or character, or two reachable pieces joined."""
    reachable: set[bytes] = set()
    for piece in sorted(pieces, key=len):
        single = len(piece) == 1 or len(piece.decode("utf-8", "replace")) == 1
        halves = ((piece[:cut], piece[cut:]) for cut in range(1, len(piece)))
        if single or any(first in reachable and rest in reachable for first, rest in halves):
            reachable.add(piece)
    return reachable


def _spm_bytes(token: bytes) -> bytes:
    """A SentencePiece piece as the bytes it spells: C{<0x0A>} a byte, C{▁} a space."""
    if len(token) == 6 and token.startswith(b"<0x") and token.endswith(b">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    return token.replace(SPM_SPACE.encode("utf-8"), b" ")


@lru_cache(maxsize=1)
def _gpt2_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is written as, back to the byte."""
    spans = (("!", "~"), ("¡", "¬"), ("®", "ÿ"))
    printable = [byte for first, last in spans for byte in range(ord(first), ord(last) + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    table = {chr(byte): byte for byte in printable}
    table.update({chr(256 + n): byte for n, byte in enumerate(others)})
    return table


def _gpt2_bytes(token: bytes) -> bytes:
    """A byte-level BPE piece as the bytes it spells; empty for one outside that alphabet."""
    table = _gpt2_table()
    try:
        return bytes(table[char] for char in token.decode("utf-8"))
    except (KeyError, UnicodeDecodeError):
        return b""


#: How each tokenizer llama.cpp runs writes its pieces, by C{tokenizer.ggml.model}: BPE's byte-level
#: alphabet, SentencePiece's. Others (WordPiece's C{##} pieces, Unigram's) are left to the runner.
DECODERS = {b"gpt2": _gpt2_bytes, b"llama": _spm_bytes}
