"""The tokens a llama.cpp sequence-state file holds, read from its head without loading the state.

C{llama_state_seq_save_file} writes: magic C{GGSQ}, version 3, a count of 32-bit
words, those words, then the KV state. llama-server's words are its
C{server_tokens} packed: C{-1} (the packed form's marker), its version (1), the
token count, the tokens, then the count of media chunks (none for text). Older
builds wrote the tokens plainly. The tokens are kept as little-endian int32
bytes, so an exact prefix is C{bytes.startswith}, done in C.

A file is opened without following a link or blocking on a FIFO, and read only
if it is a regular file whose head claims no more words than L{MAX_WORDS}: a
sparse file's head could claim gigabytes its size seems to allow.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from pathlib import Path
from typing import BinaryIO

MAGIC = 0x67677371  # LLAMA_FILE_MAGIC_GGSQ ("ggsq")
VERSION = 3
PACKED = 1  # SERVER_TOKENS_STATE_VERSION
#: The most words a head may claim: 4 Mi tokens (16 MiB read), past any context a state is saved from.
MAX_WORDS = 1 << 22
#: How much of a state L{fingerprint} reads: this many blocks, evenly spread, of this many bytes.
SAMPLES, SAMPLE = 16, 4096
_HEAD = struct.Struct("<III")
_WORD = struct.Struct("<i")


class CorruptState(Exception):
    """The file is not a whole sequence state of a version this reader knows."""


def read_tokens(path: Path) -> bytes:
    """The tokens the state file at C{path} holds, as int32 bytes.

    @raise CorruptState: a wrong magic or version, a head longer than the file or than
        L{MAX_WORDS}, media chunks.
    @raise OSError: it cannot be read, or is no regular file.
    """
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(_HEAD.size)
        if len(head) < _HEAD.size:
            raise CorruptState(f"{path.name}: shorter than a state file's head")
        magic, version, words = _HEAD.unpack(head)
        if magic != MAGIC or version != VERSION:
            raise CorruptState(f"{path.name}: not a llama.cpp sequence state of version {VERSION}")
        if _HEAD.size + 4 * words >= size:
            raise CorruptState(f"{path.name}: its tokens run past its end (truncated)")
        if words > MAX_WORDS:
            raise CorruptState(f"{path.name}: its head claims {words} words, more than any state holds")
        packed = f.read(4 * words)
    return unpack(packed, path.name)


def fingerprint(path: Path) -> str:
    """A digest of the state file's size and of L{SAMPLES} blocks spread over it: what its index entry
    keeps, so that another file put in its place (another model's state of the same shape, which
    llama-server would restore) is known before it is restored, at the cost of 64 KiB read.

    @raise OSError: it cannot be read, or is no regular file.
    """
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        digest = hashlib.sha256(str(size).encode())
        for n in range(SAMPLES):
            f.seek(max(0, size - SAMPLE) * n // (SAMPLES - 1))
            digest.update(f.read(SAMPLE))
    return digest.hexdigest()


def _open(path: Path) -> BinaryIO:
    """C{path} opened to read, if it is a regular file (not through a link, never blocking on a FIFO)."""
    f = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), "rb")
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise OSError(f"{path.name}: not a regular file")
    return f


def unpack(packed: bytes, name: str = "state") -> bytes:
    """The tokens of llama-server's packed words (plain tokens when the first word is not -1)."""
    if len(packed) < 4 or _WORD.unpack_from(packed)[0] != -1:
        return packed
    if len(packed) < 12:
        raise CorruptState(f"{name}: packed tokens without their count")
    version, count = struct.unpack_from("<II", packed, 4)
    end = 12 + 4 * count
    if version != PACKED or end + 4 > len(packed):
        raise CorruptState(f"{name}: packed tokens of an unknown version, or cut short")
    (media,) = struct.unpack_from("<I", packed, end)
    if media:
        raise CorruptState(f"{name}: holds images or audio, which are not matched by tokens")
    return packed[12:end]


def token_bytes(tokens: list[int]) -> bytes:
    """C{tokens} as the int32 bytes L{read_tokens} gives."""
    return struct.pack(f"<{len(tokens)}i", *tokens)
