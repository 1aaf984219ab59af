"""Tiny whisper.cpp ggml models of random weights that the real whisper-server loads and runs.

No package on the index ships a Whisper model in whisper.cpp's ggml format, so the tests write one:
whisper.cpp's own layout (its magic, the 11 hyperparameters, mel filters, the vocabulary, then each
tensor as ``n_dims, name length, type, ne[...], name, data``), with every tensor whisper.cpp expects
for one encoder and one decoder layer of width 64: the matrices in float16 (``ftype`` 1, which its
convolutions require), the vectors and positional embeddings in float32. The audio and text
contexts and the vocabulary size are Whisper's own (whisper.cpp fixes the special tokens' ids by
them), so a 30-second window decodes as a real model's would; the words are random. A test of this
model checks the path and the answer's shape, never its text.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import numpy as np

MAGIC = 0x67676D6C
#: Multilingual Whisper's vocabulary size (an English-only one has 51864, and whisper.cpp then neither
#: translates nor takes another language).
VOCAB = 51865
AUDIO_CTX = 1500
TEXT_CTX = 448
STATE = 64
HEADS = 1
LAYERS = 1
MELS = 80
N_FFT = 201
#: The first GPT-2 tokens written with names; whisper.cpp names the special tokens past them itself.
WORDS = 50256
F32, F16 = 0, 1
#: GPT-2's blank token, which whisper.cpp looks up by its text to keep it from starting a segment.
SPACE = 220


def hparams(layers: int = LAYERS) -> tuple[int, ...]:
    """The 11 header integers whisper.cpp reads, in its order."""
    return (VOCAB, AUDIO_CTX, STATE, HEADS, layers, TEXT_CTX, STATE, HEADS, layers, MELS, F16)


def _tensors(layers: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Each tensor's name and shape (ggml's order: the fastest-moving dimension first)."""
    s = STATE
    yield "encoder.positional_embedding", (s, AUDIO_CTX)
    yield "encoder.conv1.weight", (3, MELS, s)
    yield "encoder.conv1.bias", (1, s)
    yield "encoder.conv2.weight", (3, s, s)
    yield "encoder.conv2.bias", (1, s)
    yield "encoder.ln_post.weight", (s,)
    yield "encoder.ln_post.bias", (s,)
    yield "decoder.positional_embedding", (s, TEXT_CTX)
    yield "decoder.token_embedding.weight", (s, VOCAB)
    yield "decoder.ln.weight", (s,)
    yield "decoder.ln.bias", (s,)
    for system, attentions in (("encoder", ("attn",)), ("decoder", ("attn", "cross_attn"))):
        for layer in range(layers):
            block = f"{system}.blocks.{layer}"
            yield f"{block}.mlp_ln.weight", (s,)
            yield f"{block}.mlp_ln.bias", (s,)
            yield f"{block}.mlp.0.weight", (s, 4 * s)
            yield f"{block}.mlp.0.bias", (4 * s,)
            yield f"{block}.mlp.2.weight", (4 * s, s)
            yield f"{block}.mlp.2.bias", (s,)
            for attention in attentions:
                yield f"{block}.{attention}_ln.weight", (s,)
                yield f"{block}.{attention}_ln.bias", (s,)
                for part in ("query", "key", "value", "out"):
                    yield f"{block}.{attention}.{part}.weight", (s, s)
                    if part != "key":
                        yield f"{block}.{attention}.{part}.bias", (s,)


#: The word a peaked model says (one of the named tokens, not a special one).
PEAK = 1000


def _peaked(name: str, values: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """The decoder's last norm gives a constant state along C{direction}; L{PEAK}'s embedding points
    along it (its logit 40, the others' near 0)."""
    if name == "decoder.ln.weight":
        return np.zeros_like(values)
    if name == "decoder.ln.bias":
        return direction
    if name == "decoder.token_embedding.weight":
        values = values.copy()
        values[PEAK] = 40 * direction
    return values


def write(path: str | os.PathLike[str], seed: int = 0, layers: int = LAYERS, peaked: bool = False) -> str:
    """Write a random-weight whisper ggml model to C{path}; the same C{seed} writes the same bytes.

    C{peaked}: the decoder's output is one word, whatever it hears, by a margin no sampling
    temperature overcomes, so every transcription of a clip takes the same work (the bench's
    need: a random model's near-uniform words make whisper.cpp's temperature fallback sample
    answers of any length).
    """
    rng = np.random.default_rng(seed)
    direction = rng.normal(0, 1, STATE)
    direction /= np.linalg.norm(direction)
    with open(path, "wb") as f:
        f.write(struct.pack("<I", MAGIC))
        f.write(struct.pack("<11i", *hparams(layers)))
        f.write(struct.pack("<ii", MELS, N_FFT))
        f.write(rng.random(MELS * N_FFT, dtype=np.float32).tobytes())
        f.write(struct.pack("<i", WORDS))
        for n in range(WORDS):
            word = b" " if n == SPACE else f" w{n}".encode()
            f.write(struct.pack("<I", len(word)) + word)
        for name, shape in _tensors(layers):
            encoded = name.encode()
            half = name.endswith(".weight") and len(shape) > 1
            f.write(struct.pack(f"<iii{len(shape)}i", len(shape), len(encoded), F16 if half else F32, *shape))
            f.write(encoded)
            norm = name.endswith("ln.weight") or name.endswith("ln_post.weight")
            rows = tuple(reversed(shape))  # numpy's last axis is ggml's first, the fastest-moving
            values = np.ones(rows) if norm else rng.normal(0, 0.05, rows)
            if peaked:
                values = _peaked(name, values, direction)
            f.write(values.astype(np.float16 if half else np.float32).tobytes())
    return os.fspath(path)


if __name__ == "__main__":
    import sys

    print(write(sys.argv[1]))
