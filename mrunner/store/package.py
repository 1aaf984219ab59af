"""What ``mrunner package`` uploads: a tar of the model's files, each kind in its place.

- ``*.gguf`` at the top: the weights, one file or the shards of a split model in order;
- or ``*.bin`` at the top: a whisper.cpp ggml model (speech to text), one file;
- ``licenses/*``: license texts;
- ``mmproj/*``: at most one multimodal projector;
- ``chat-template/*``: at most one Jinja chat template.

The tar is read as its bytes arrive (L{Untar}), so an import writes and hashes
each byte once, as it comes off the socket (see L{mrunner.store.upload}).
Members are never extracted, so no name in the archive becomes a path.
Sparse members are refused: their holes would make a small upload a huge blob.
"""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from collections.abc import Callable

from mrunner.errors import BadRequest
from mrunner.store.artifact import CHAT_TEMPLATE, GGUF, LICENSE, MMPROJ, WHISPER

LICENSES_DIR = "licenses/"
MMPROJ_DIR = "mmproj/"
TEMPLATE_DIR = "chat-template/"
MAX_LICENSE_BYTES = 1024 * 1024
MAX_LICENSES = 16
MAX_LICENSES_BYTES = 4 * 1024 * 1024
MAX_TEMPLATE_BYTES = 1024 * 1024
MAX_SHARDS = 256

BLOCK = tarfile.BLOCKSIZE
#: Headers that describe the member after them (PAX records, GNU long names): their data is header too.
EXTENSIONS = frozenset(
    {
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    }
)
#: A member's header and its extensions may take this much; names and PAX records are short.
MAX_HEADER_BYTES = 1024 * 1024
ENCODING = "utf-8"

#: Where a member's data goes, piece by piece as it arrives.
Write = Callable[[memoryview], object]


def ignore(_: memoryview) -> None:
    """The data of a member nobody keeps (a directory's, or one refused already)."""


class Untar:
    """A tar archive read from the bytes given to L{feed}, in order, as they come: no seek, no temp file.

    tarfile can only pull from a file. Here each member's header blocks (its
    PAX or GNU extensions included) are collected and handed to tarfile to
    read, so names and sizes come out as tarfile reads them; the member's data
    then goes to the L{Write} that C{start(member)} returns, without a copy.
    Reading ends at the first zero block, the archive's end.
    """

    def __init__(self, start: Callable[[tarfile.TarInfo], Write]) -> None:
        self._start = start
        self._header = bytearray()  # the current member's header blocks so far
        self._extension = 0  # bytes of an extension header's data still to come
        self._write: Write = ignore
        self._data = 0  # bytes of the member's data still to come
        self._padding = 0  # then bytes up to its next block
        self._member = ""  # the name of the last member started, for errors
        self.ended = False

    def feed(self, view: memoryview) -> None:
        """Read the next bytes of the archive.

        @raise BadRequest: a header that is not tar's, or a sparse member.
        """
        while view and not self.ended:
            if self._data:
                piece = view[: self._data]
                self._write(piece)
                self._data -= len(piece)
            elif self._padding:
                piece = view[: self._padding]
                self._padding -= len(piece)
            else:
                wanted = self._extension or BLOCK - len(self._header) % BLOCK
                piece = view[:wanted]
                self._header += piece
                if self._extension:
                    self._extension -= len(piece)
                elif len(self._header) % BLOCK == 0:
                    self._block()
            view = view[len(piece) :]

    def end(self) -> None:
        """The archive's bytes are all in.

        @raise BadRequest: they stop in the middle of a header or a member.
        """
        if not self.ended and (self._header or self._data or self._padding):
            where = f"in the middle of {self._member!r}" if self._data or self._padding else "in a header"
            raise invalid(f"the package ends {where}: the upload was cut short")

    def _block(self) -> None:
        """A header block is in: the archive's end, an extension, or a member whose data follows."""
        block = bytes(self._header[-BLOCK:])
        if len(self._header) == BLOCK and block.count(0) == BLOCK:
            self.ended = True
            return
        try:
            header = tarfile.TarInfo.frombuf(block, ENCODING, "surrogateescape")
        except tarfile.HeaderError as e:
            raise invalid(f"the package is not a tar archive: {e}") from None
        if header.type in EXTENSIONS:
            self._extension = padded(header.size)
            if len(self._header) + self._extension > MAX_HEADER_BYTES:
                raise invalid(f"a tar header takes over {MAX_HEADER_BYTES} bytes")
            return
        if header.type == tarfile.GNUTYPE_SPARSE or b"GNU.sparse." in self._header:
            raise invalid(
                f"sparse tar members are not accepted ({header.name!r}): write the tar without --sparse"
            )
        member = _member(bytes(self._header))
        self._header.clear()
        self._member = member.name
        self._write = self._start(member)
        self._data, self._padding = member.size, padded(member.size) - member.size


def _member(header: bytes) -> tarfile.TarInfo:
    """The member that C{header} (its blocks, extensions first) describes, as tarfile reads it."""
    try:
        member = tarfile.TarFile(
            fileobj=io.BytesIO(header), encoding=ENCODING, errors="surrogateescape"
        ).next()
    except (tarfile.TarError, ValueError) as e:
        raise invalid(f"the package is not a tar archive: {e}") from None
    if member is None:
        raise invalid("the package is not a tar archive: a header tarfile cannot read")
    return member


def member_kind(member: tarfile.TarInfo) -> str | None:
    """The part of a model a package member is (its layer's media type), by its place; None for others."""
    if not member.isfile():
        return None
    name = member.name
    if "/" not in name and name.endswith(".gguf"):
        return GGUF
    if "/" not in name and name.endswith(".bin"):
        return WHISPER
    for directory, kind in ((LICENSES_DIR, LICENSE), (MMPROJ_DIR, MMPROJ), (TEMPLATE_DIR, CHAT_TEMPLATE)):
        if name.startswith(directory):
            return kind
    return None


def check_members(seen: Counter[str], unexpected: list[str]) -> None:
    """@raise BadRequest: a package whose members, C{seen} by kind, lack weights or hold what they may not."""
    whisper = seen[WHISPER] == 1 and not seen[GGUF] and not seen[MMPROJ] and not seen[CHAT_TEMPLATE]
    gguf = seen[GGUF] and not seen[WHISPER] and seen[MMPROJ] <= 1 and seen[CHAT_TEMPLATE] <= 1
    if unexpected or not (whisper or gguf) or seen[GGUF] > MAX_SHARDS:
        raise invalid(
            "a package holds the weights (one .gguf file, or up to"
            f" {MAX_SHARDS} shards in order; or one Whisper model's .bin) at its top, license files under"
            f" {LICENSES_DIR}, and beside GGUF weights at most one projector under {MMPROJ_DIR} and one"
            f" chat template under {TEMPLATE_DIR}; this one has {seen[GGUF]} .gguf file(s),"
            f" {seen[WHISPER]} .bin file(s), {seen[MMPROJ]} projector(s), {seen[CHAT_TEMPLATE]} template(s)"
            f" and {unexpected or 'nothing else'}"
        )


def check_license(member: tarfile.TarInfo, count: int, total: int) -> None:
    """@raise BadRequest: the C{count}th license C{member}, after others of C{total} bytes, is over a cap."""
    if count > MAX_LICENSES:
        raise invalid(f"a package holds at most {MAX_LICENSES} licenses; this one has more")
    if member.size > MAX_LICENSE_BYTES:
        raise invalid(f"license {member.name} is over {MAX_LICENSE_BYTES} bytes")
    if total + member.size > MAX_LICENSES_BYTES:
        raise invalid(
            f"the licenses take {total + member.size} bytes together;"
            f" at most {MAX_LICENSES_BYTES} are accepted"
        )


def check_template_size(member: tarfile.TarInfo) -> None:
    if member.size > MAX_TEMPLATE_BYTES:
        raise invalid(f"the chat template is over {MAX_TEMPLATE_BYTES} bytes")


def check_template(text: bytes) -> None:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("the chat template is not UTF-8 text") from None


def padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def invalid(message: str) -> BadRequest:
    return BadRequest(message, code="invalid_package")
