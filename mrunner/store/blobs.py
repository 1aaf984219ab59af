"""Content-addressed files: ``blobs/sha256/<hex>``, written through ``*.incomplete`` temps.

A blob's file name is only ever a validated hex digest, so no name from a
request reaches the file system. A blob appears under its final name only
after its sha256 was checked, by an atomic rename; anything ending in
``.incomplete`` is work in progress (kept so a pull can resume) and is never
taken for a blob. A blob found corrupt is moved aside to ``quarantine/``,
so nothing loads it and a pull fetches it afresh; renames are made durable by
an fsync of the directory, since a crash may otherwise forget them.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from mrunner.names import DIGEST

INCOMPLETE = ".incomplete"
_STAGED = "import-"
CHUNK = 1024 * 1024


class DigestMismatch(ValueError):
    """The bytes written do not hash to the digest they were announced with."""


def fsync_dir(path: Path) -> None:
    """Make the renames in C{path} durable: without it a crash may lose a committed write."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hash_file(path: Path) -> str:
    """The sha256 digest of the file at C{path} (blocking: a thread's job for big files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


class Blobs:
    """The blob directory of a store, and the quarantine beside it.

    C{verified} holds the digests whose content was hashed since the daemon
    started (written here, or checked): only those are trusted without hashing.
    """

    def __init__(self, root: Path, quarantine: Path) -> None:
        self.root = root
        self._root = str(root)
        self.quarantine_root = quarantine
        root.mkdir(parents=True, exist_ok=True)
        quarantine.mkdir(parents=True, exist_ok=True)
        self.verified: set[str] = set()

    def path(self, digest: str) -> Path:
        return Path(self.file(digest))

    def file(self, digest: str) -> str:
        """L{path} as a string, without pathlib's cost: models are resolved on every request."""
        if not DIGEST.fullmatch(digest):
            raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
        return os.path.join(self._root, digest[7:])

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int | None:
        """The stored size, or None when the blob is not here."""
        try:
            return os.stat(self.file(digest)).st_size
        except FileNotFoundError:
            return None

    def intact(self, digest: str) -> bool:
        """Whether the blob hashes to its name (blocking: run it in a thread)."""
        return hash_file(self.path(digest)) == digest

    def quarantine(self, digest: str) -> None:
        """Move a corrupt blob out of the store, kept for inspection until a good copy arrives."""
        self.verified.discard(digest)
        try:
            os.replace(self.path(digest), self.quarantined(digest))
        except FileNotFoundError:  # moved already, by a check that finished first
            return
        fsync_dir(self.root)
        fsync_dir(self.quarantine_root)

    def quarantined(self, digest: str) -> Path:
        return self.quarantine_root / self.path(digest).name

    def read(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()

    def put(self, data: bytes) -> str:
        """Store small C{data} (a manifest, a config) and return its digest."""
        writer = self.writer(None)
        writer.write(data)
        return writer.commit()

    def remove(self, digest: str) -> None:
        self.path(digest).unlink(missing_ok=True)
        self.quarantined(digest).unlink(missing_ok=True)
        self.verified.discard(digest)

    def digests(self) -> Iterator[str]:
        """Digests of the committed blobs; temps are not blobs."""
        for entry in os.scandir(self.root):
            digest = "sha256:" + entry.name
            if entry.is_file() and DIGEST.fullmatch(digest):
                yield digest

    def usage(self) -> int:
        """Bytes of blobs and quarantined blobs; partial downloads are counted apart."""
        return sum(
            entry.stat().st_size
            for directory in (self.root, self.quarantine_root)
            for entry in os.scandir(directory)
            if entry.is_file() and not entry.name.endswith(INCOMPLETE)
        )

    def partials_usage(self) -> int:
        return sum(entry.stat().st_size for entry in self._partials())

    def remove_partials(self, older_than: float, now: float) -> None:
        """Remove partial downloads untouched for C{older_than} seconds: nobody is resuming them."""
        for entry in self._partials():
            if entry.stat().st_mtime < now - older_than:
                os.unlink(entry.path)

    def _partials(self) -> Iterator[os.DirEntry[str]]:
        return (entry for entry in os.scandir(self.root) if entry.name.endswith(INCOMPLETE))

    def writer(self, expected: str | None, resume: bool = False) -> BlobWriter:
        """A writer for a blob; C{expected} names it (and allows resuming), else a fresh temp."""
        if expected is None:
            temp = self.staged_temp()
        else:
            temp = self.path(expected).with_name(self.path(expected).name + INCOMPLETE)
        return BlobWriter(self, temp, expected, resume)

    def staged_temp(self) -> Path:
        """A fresh name for an import's file, removed at start if a crash left it (L{remove_staged})."""
        return self.root / f"{_STAGED}{uuid.uuid4().hex}{INCOMPLETE}"

    def place(self, temp: Path, digest: str) -> None:
        """Rename the checked file C{temp} into place as the blob C{digest}, durably."""
        os.replace(temp, self.path(digest))
        temp.unlink(missing_ok=True)  # still there when it was a link to the blob already in place
        fsync_dir(self.root)
        self.verified.add(digest)
        self.quarantined(digest).unlink(missing_ok=True)

    def remove_staged(self) -> None:
        """Remove import temps left by a crash: unlike named partial blobs they cannot resume."""
        for entry in os.scandir(self.root):
            if entry.name.startswith(_STAGED) and entry.name.endswith(INCOMPLETE):
                os.unlink(entry.path)


class BlobWriter:
    """Writes one blob to its temp file, hashing as it goes.

    With C{resume}, bytes already in the temp are hashed first and kept, so a
    download continues where it stopped (HTTP Range from L{offset}).
    """

    def __init__(self, blobs: Blobs, temp: Path, expected: str | None, resume: bool) -> None:
        self._blobs = blobs
        self.temp = temp
        self.expected = expected
        self._hash = hashlib.sha256()
        self._file: BinaryIO = open(temp, "ab" if resume else "wb")  # noqa: SIM115
        self.offset = 0
        if resume:
            with open(temp, "rb") as existing:
                while chunk := existing.read(CHUNK):
                    self._hash.update(chunk)
                    self.offset += len(chunk)

    def write(self, data: bytes | memoryview) -> None:
        self._hash.update(data)
        self._file.write(data)
        self.offset += len(data)

    def restart(self) -> None:
        """Throw away what was written (the server ignored our Range)."""
        self._file.seek(0)
        self._file.truncate()
        self._hash = hashlib.sha256()
        self.offset = 0

    def copy(self, source: BinaryIO) -> None:
        """Write everything C{source} has (blocking: run it in a thread for big files)."""
        while chunk := source.read(CHUNK):
            self.write(chunk)

    def flush(self) -> None:
        """Hand what was written to the kernel, so that other readers of the temp see it all."""
        self._file.flush()

    def seal(self) -> str:
        """Flush to disk and close (slow for big blobs: a thread's job); the digest written."""
        if not self._file.closed:
            self.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        return "sha256:" + self._hash.hexdigest()

    def commit(self) -> str:
        """Verify and rename into place; the digest of the blob.

        @raise DigestMismatch: the content is not the expected blob (the temp is removed).
        """
        digest = self.seal()
        if self.expected is not None and digest != self.expected:
            self.discard()
            raise DigestMismatch(f"expected {self.expected}, got {digest}")
        self._blobs.place(self.temp, digest)
        return digest

    def close(self) -> None:
        """Stop writing but keep the temp, so a later pull resumes it."""
        self._file.close()

    def discard(self) -> None:
        self._file.close()
        self.temp.unlink(missing_ok=True)


class LinkedBlob:
    """A blob staged as a hard link to another tool's file: hashed once, never written to.

    It is committed as a L{BlobWriter} is, so an import of links and one of copies end alike.
    """

    def __init__(self, blobs: Blobs, temp: Path) -> None:
        self._blobs = blobs
        self.temp = temp
        self.offset = os.stat(temp).st_size
        self._digest = hash_file(temp)

    def seal(self) -> str:
        return self._digest

    def commit(self) -> str:
        self._blobs.place(self.temp, self._digest)
        return self._digest

    def discard(self) -> None:
        self.temp.unlink(missing_ok=True)
