"""Whether stored blobs are still what their digests say: sizes, hashes once per start, quarantine.

A blob is trusted without hashing only when it was hashed since the daemon
started (written by this daemon, or checked): after a restart, or when a pull
finds a blob already there, it is hashed again. A blob that fails is moved
to quarantine, so nothing loads it and a pull fetches it afresh.

Sizes in the store's own manifests are trusted; a size a remote announces is
not: a remote that names a blob the store holds with another size is wrong,
unless a fresh hash of the store's bytes says otherwise (L{Integrity.holds}).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mrunner.store.artifact import Descriptor, Manifest
from mrunner.store.blobs import Blobs
from mrunner.store.locks import KeyedLocks


class SizeDisagrees(ValueError):
    """A remote announces a blob the store holds, its bytes hashed good just now, with another size."""

    def __init__(self, digest: str, announced: int, stored: int) -> None:
        super().__init__(
            f"announces blob {digest} as {announced} bytes, but it is {stored} bytes (the store holds it,"
            " and its bytes hash to that digest): the pull is refused and the store's copy kept"
        )


class Integrity:
    """Checks the blobs of a store; C{in_thread} runs the hashing off the reactor."""

    log = Logger()

    def __init__(self, blobs: Blobs, in_thread: Callable[..., Deferred[Any]]) -> None:
        self.blobs = blobs
        self._in_thread = in_thread
        self._hashing = KeyedLocks()

    def known_good(self, blob: Descriptor) -> bool:
        return blob.digest in self.blobs.verified and self.blobs.size(blob.digest) == blob.size

    async def intact(self, blob: Descriptor, rehash: bool = False) -> bool:
        """Whether C{blob} is here with its size, hashed since start (or now, with C{rehash}).

        A blob of the wrong size or content is quarantined.
        """
        size = self.blobs.size(blob.digest)
        if size is None:
            return False
        if size != blob.size:
            self._quarantine(blob.digest, f"{size} bytes instead of {blob.size}")
            return False
        if rehash:
            self.blobs.verified.discard(blob.digest)
        async with self._hashing.holding(blob.digest):
            if blob.digest in self.blobs.verified:
                return True
            if not self.blobs.has(blob.digest):  # quarantined while this one waited
                return False
            if not await self._in_thread(self.blobs.intact, blob.digest):
                self._quarantine(blob.digest, "its content does not match its digest")
                return False
            self.blobs.verified.add(blob.digest)
            return True

    async def holds(self, blob: Descriptor) -> bool:
        """Whether the store holds C{blob}, as a remote announces it, intact.

        A held blob of another size is hashed afresh: it is quarantined only if its
        own bytes condemn it, never for a size a remote gives.

        @raise SizeDisagrees: the held blob is good, so the announced size is wrong.
        """
        stored = self.blobs.size(blob.digest)
        if stored is not None and stored != blob.size:
            if await self.intact(attrs.evolve(blob, size=stored), rehash=True):
                raise SizeDisagrees(blob.digest, blob.size, stored)
            return False
        return await self.intact(blob)

    def problem(self, digest: str, manifest: Manifest) -> str | None:
        """Why the model's blobs cannot be used (the first missing or quarantined one), if they cannot."""
        for blob in (digest, *(b.digest for b in manifest.blobs)):  # on every request: a stat each
            if self.blobs.size(blob) is None:
                what = f"its {'manifest' if blob == digest else manifest.role(blob)} {blob}"
                if self.blobs.quarantined(blob).exists():
                    return f"{what} is corrupt (moved to {self.blobs.quarantine_root})"
                return f"{what} is missing"
        return None

    def _quarantine(self, digest: str, why: str) -> None:
        self.log.error("blob {digest} is corrupt ({why}): quarantined", digest=digest, why=why)
        self.blobs.quarantine(digest)
