"""A GGUF file's header, read within bounds: what the file can hold, and what a real model needs.

The ``gguf`` package's C{GGUFReader} trusts the counts a file declares and
walks every array element by element into Python lists: a 159-byte file
declaring a ``uint8`` array of 2^40 elements grew it until the kernel's OOM
killer stopped it, and a true 10-million-element array took over a minute.
Here every length and count is checked against the bytes left in the file and
against limits no real model comes near before anything is read; arrays of
fixed-size items are passed in one seek, string arrays by their lengths only,
and only the scalars are kept (a model's config blob keeps nothing else).
Tensors must lie inside the file, aligned, of a type llama.cpp knows.

Only the little-endian GGUF versions 2 and 3 are read: what llama-server loads.
"""

from __future__ import annotations

import math
import struct
from typing import Any, BinaryIO

import attrs

MAGIC = b"GGUF"
VERSIONS = (2, 3)
#: Longest string: chat templates run to tens of KiB.
MAX_STRING = 16 * 1024 * 1024
#: Most elements in an array: vocabularies and merges run to a few hundred thousand.
MAX_ARRAY = 2**24
MAX_KEYS = 2**16
MAX_TENSORS = 2**20
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
WINDOW = 1024 * 1024

STRING, ARRAY = 8, 9
#: Fixed-size value types by their GGUF type number: struct format.
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class HeaderError(ValueError):
    """The file is not a GGUF file llama.cpp could load, or declares more than it holds."""


@attrs.frozen
class Tensor:
    name: str
    type: int
    shape: tuple[int, ...]
    offset: int  # from the start of the data, after the header
    bytes: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@attrs.frozen
class Header:
    metadata: dict[str, Any]  # scalars only: arrays (the vocabulary) are passed over
    tensors: tuple[Tensor, ...]


class _Cursor:
    """Reads from C{file}, never past its C{size}: every length is checked before it is read."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self._file = file
        self.size = size
        self.offset = 0

    def left(self) -> int:
        return self.size - self.offset

    def need(self, count: int, what: str) -> None:
        if count > self.left():
            raise HeaderError(
                f"{what} declares {count} bytes at offset {self.offset}, but the file has"
                f" {self.left()} bytes left"
            )

    def read(self, count: int, what: str) -> bytes:
        self.need(count, what)
        data = self._file.read(count)
        if len(data) != count:  # the file shrank while it was read
            raise HeaderError(f"the file ended inside {what}")
        self.offset += count
        return data

    def peek(self, count: int) -> bytes:
        """Up to C{count} of the next bytes, left unread."""
        data = self._file.read(min(count, self.left()))
        self._file.seek(-len(data), 1)
        return data

    def skip(self, count: int, what: str) -> None:
        self.need(count, what)
        self._file.seek(count, 1)
        self.offset += count

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt), what))[0]

    def count(self, what: str, limit: int, item_size: int) -> int:
        """A declared count of items of at least C{item_size} bytes each: within C{limit} and the file."""
        count: int = self.unpack("Q", what)
        if count > limit:
            raise HeaderError(f"{what} is {count}; at most {limit} are read")
        self.need(count * item_size, f"{what} of {count}")
        return count

    def string(self, what: str) -> str:
        length = self.count(f"the length of {what}", MAX_STRING, 1)
        try:
            return self.read(length, what).decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderError(f"{what} is not UTF-8") from None


def read_header(file: BinaryIO, size: int) -> Header:
    """The header of the GGUF file C{file} of C{size} bytes, opened at its start.

    @raise HeaderError: not a GGUF file, or one that declares more than it holds.
    """
    cursor = _Cursor(file, size)
    tensor_count, key_count = _counts(cursor)
    metadata: dict[str, Any] = {}
    for _ in range(key_count):
        key = cursor.string("a metadata key")
        kind = cursor.unpack("I", f"the type of {key}")
        if kind == ARRAY:
            _skip_array(cursor, key)
        else:
            metadata[key] = _scalar(cursor, kind, key)
    tensors = tuple(_tensor(cursor) for _ in range(tensor_count))
    _check_data(cursor, metadata, tensors)
    return Header(metadata, tensors)


def read_strings(file: BinaryIO, size: int, keys: tuple[str, ...]) -> dict[str, list[bytes]]:
    """The metadata C{keys} of the GGUF file C{file} that are strings or arrays of strings, as bytes
    (a string is a list of one), read within the same bounds as L{read_header}; the walk stops at
    the last one found. A vocabulary's pieces need not be UTF-8 each.

    @raise HeaderError: not a GGUF file, or one that declares more than it holds.
    """
    cursor = _Cursor(file, size)
    found: dict[str, list[bytes]] = {}
    for _ in range(_counts(cursor)[1]):
        if len(found) == len(keys):
            break
        key = cursor.string("a metadata key")
        kind = cursor.unpack("I", f"the type of {key}")
        if key in keys and kind == STRING:
            found[key] = [cursor.read(cursor.count(f"the length of {key}", MAX_STRING, 1), key)]
        elif key in keys and kind == ARRAY and cursor.peek(4) == struct.pack("<I", STRING):
            cursor.skip(4, key)
            found[key] = []
            _strings(cursor, key, cursor.count(f"the length of {key}", MAX_ARRAY, 8), found[key])
        elif kind == ARRAY:
            _skip_array(cursor, key)
        else:
            _scalar(cursor, kind, key)
    return found


def _counts(cursor: _Cursor) -> tuple[int, int]:
    """The counts of tensors and metadata keys, after the magic number and a version llama.cpp reads."""
    if cursor.size < 4 or cursor.read(4, "the magic number") != MAGIC:
        raise HeaderError("the file does not start with GGUF's magic number")
    version = cursor.unpack("I", "the version")
    if version not in VERSIONS:
        raise HeaderError(f"GGUF version {version} (or a big-endian file); llama.cpp reads versions 2 and 3")
    tensors = cursor.count("the tensor count", MAX_TENSORS, 8 + 4 + 4 + 8)
    return tensors, cursor.count("the metadata count", MAX_KEYS, 8 + 4)


def _scalar(cursor: _Cursor, kind: int, key: str) -> Any:
    if kind == STRING:
        return cursor.string(key)
    if kind not in SCALARS:
        raise HeaderError(f"{key} has the unknown type {kind}")
    return cursor.unpack(SCALARS[kind], key)


def _skip_array(cursor: _Cursor, key: str) -> None:
    kind = cursor.unpack("I", f"the item type of {key}")
    if kind == STRING:
        _strings(cursor, key, cursor.count(f"the length of {key}", MAX_ARRAY, 8))
    elif kind in SCALARS:
        size = struct.calcsize(SCALARS[kind])
        cursor.skip(cursor.count(f"the length of {key}", MAX_ARRAY, size) * size, key)
    else:
        raise HeaderError(f"{key} is an array of type {kind}, which llama.cpp does not read")


def _strings(cursor: _Cursor, key: str, count: int, into: list[bytes] | None = None) -> None:
    """Pass C{count} strings, a window of the file at a time (kept C{into} a list where one is given):
    a vocabulary of a million tokens in about a second on a slow machine, where a checked read of
    each took eight."""
    length = struct.Struct("<Q")
    while count:
        window = cursor.peek(WINDOW)
        at = 0
        while count and at + 8 <= len(window):
            end = at + 8 + length.unpack_from(window, at)[0]
            if end > len(window):
                break
            if into is not None:
                into.append(window[at + 8 : end])
            at = end
            count -= 1
        cursor.skip(at, key)
        if count and not at:  # a string longer than the window, or one past the end: checked alone
            string = cursor.read(cursor.count(f"the length of a string in {key}", MAX_STRING, 1), key)
            if into is not None:
                into.append(string)
            count -= 1


def _tensor(cursor: _Cursor) -> Tensor:
    name = cursor.string("a tensor name")
    dims = cursor.unpack("I", f"the dimensions of {name}")
    if not 0 < dims <= MAX_DIMS:
        raise HeaderError(f"tensor {name} has {dims} dimensions; llama.cpp allows 1 to {MAX_DIMS}")
    shape = tuple(cursor.unpack("Q", f"the shape of {name}") for _ in range(dims))
    kind = cursor.unpack("I", f"the type of {name}")
    offset = cursor.unpack("Q", f"the offset of {name}")
    # Here, not above: gguf brings numpy (some 20 MB), and the daemon reads vocabularies with this
    # module (L{read_strings}) where only the child that reads a whole header needs the types.
    from gguf.constants import GGML_QUANT_SIZES

    if kind not in GGML_QUANT_SIZES:
        raise HeaderError(f"tensor {name} has the unknown type {kind}")
    block, block_bytes = GGML_QUANT_SIZES[kind]
    elements = math.prod(shape)
    if shape[0] % block:
        raise HeaderError(f"tensor {name}'s rows of {shape[0]} are not whole blocks of {block}")
    return Tensor(name, kind, shape, offset, elements // block * block_bytes)


def _check_data(cursor: _Cursor, metadata: dict[str, Any], tensors: tuple[Tensor, ...]) -> None:
    """@raise HeaderError: a tensor whose data is misaligned or lies past the end of the file."""
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise HeaderError(f"general.alignment {alignment!r} is not a power of two")
    start = -(-cursor.offset // alignment) * alignment
    for tensor in tensors:
        if tensor.offset % alignment:
            raise HeaderError(f"tensor {tensor.name}'s data is not aligned to {alignment} bytes")
        if start + tensor.offset + tensor.bytes > cursor.size:
            raise HeaderError(
                f"tensor {tensor.name} needs {tensor.bytes} bytes at {start + tensor.offset},"
                f" past the end of the file ({cursor.size} bytes)"
            )
