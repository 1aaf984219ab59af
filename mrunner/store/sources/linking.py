"""A found model brought into the store as hard links to its files: no second copy, hashed once.

A hard link is the same file under a second name: the store's blob and the
tool's file share their bytes, removing either name leaves the other whole,
and neither tool ever writes a blob in place. Where the store is on another
file system (or the kernel refuses the link: another user's file), the file is
copied and the import says so, with the space the copy takes.

Each file is linked (or copied) to a staged name in the store first, checked
to be the very file that was found, and hashed there: a digest the source
named it by must match. The commit is the one every import makes
(L{mrunner.store.imports}); any failure leaves nothing behind.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from mrunner.store import gguf_meta
from mrunner.store.artifact import LICENSE, layered
from mrunner.store.blobs import Blobs, BlobWriter, LinkedBlob
from mrunner.store.sources.found import Found, Refused, SourceFile
from mrunner.store.sources.ollama import template_notes
from mrunner.store.upload import Staged, StoreWriteFailed
from mrunner.values.sizes import format_size

#: Why a link may be refused where a copy is not: another file system, another user's file, too many links.
NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})
MAX_LICENSE = 1024 * 1024


class Linking:
    """The staged files of one import of C{found}: links where the file system allows, copies else."""

    def __init__(self, blobs: Blobs, found: Found) -> None:
        self._blobs = blobs
        self._found = found
        self._parts: list[BlobWriter | LinkedBlob] = []
        self.taken = False
        self.linked = 0
        self.copied = 0
        self.notes = list(found.notes)

    def stage(self) -> Staged:
        """Link or copy every file, check and hash it, read the GGUF headers (blocking: a thread's job).

        @raise Refused: a file is not the one found, or does not hash to the digest it is named by.
        """
        found = self._found
        parts: list[tuple[str, BlobWriter | LinkedBlob]] = [
            (kind, self._license(f) if kind == LICENSE else self._place(f))
            for kind, f in layered(found.weights, found.licenses, found.projector)
        ]
        infos = gguf_meta.read_all([part.temp for kind, part in parts if kind != LICENSE])
        info = gguf_meta.of_model(infos, found.projector is not None)
        self.notes = template_notes(self.notes, info.metadata)
        return info, parts

    def discard(self) -> None:
        """Remove the staged names not committed (the source's files are never touched)."""
        for part in self._parts:
            part.discard()

    def report(self) -> dict[str, Any]:
        """What the import did, for the person who asked: linked or copied, and what it decided."""
        how = (
            f"linked {self.linked} file(s) (no copy)"
            if not self.copied
            else (
                f"copied {format_size(self.copied)}: the store cannot hard-link these files"
                " (another file system, or files it may not link)"
            )
        )
        return {"linked": self.linked, "copied_bytes": self.copied, "message": how, "notes": self.notes}

    def _place(self, source: SourceFile) -> BlobWriter | LinkedBlob:
        """C{source} staged in the store, linked or copied, checked to be the file found and hashed."""
        try:
            part = self._link_or_copy(source)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise StoreWriteFailed(f"the store cannot hold {source.path}: {e.strerror}") from None
            raise Refused(f"{source.path} cannot be imported: {e.strerror}") from None
        digest = part.seal()
        if source.digest is not None and digest != source.digest:
            raise Refused(
                f"{source.path} is named for {source.digest} but its content hashes to {digest}:"
                " the source's file is damaged or not what it claims; nothing was imported"
            )
        return part

    def _link_or_copy(self, source: SourceFile) -> BlobWriter | LinkedBlob:
        temp = self._blobs.staged_temp()
        found = os.stat(source.path, follow_symlinks=False)
        try:
            os.link(source.path, temp, follow_symlinks=False)
        except OSError as e:
            if e.errno not in NO_LINK:
                raise
            return self._copy(source)
        return self._linked(temp, found)

    def _linked(self, temp: Path, found: os.stat_result) -> LinkedBlob:
        staged = os.stat(temp, follow_symlinks=False)
        if not stat.S_ISREG(staged.st_mode) or (staged.st_dev, staged.st_ino) != (found.st_dev, found.st_ino):
            temp.unlink(missing_ok=True)
            raise Refused(
                f"{self._found.ref}: a file was replaced while it was imported; nothing was imported"
            )
        part = LinkedBlob(self._blobs, temp)
        self._parts.append(part)
        self.linked += 1
        return part

    def _copy(self, source: SourceFile) -> BlobWriter:
        """A copy of C{source}, hashed as it is written; opened without following a link."""
        writer = self._blobs.writer(None)
        self._parts.append(writer)
        fd = os.open(source.path, os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise Refused(f"{source.path} is not a regular file")
            writer.copy(file)
        self.copied += writer.offset
        return writer

    def _license(self, source: SourceFile) -> BlobWriter | LinkedBlob:
        if source.size > MAX_LICENSE:
            raise Refused(f"the license {source.path} is over {MAX_LICENSE} bytes")
        return self._place(source)
