"""One lock per blob digest, so work on one blob (a download, a hash) is done once at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from twisted.internet.defer import DeferredLock


class KeyedLocks:
    """A C{DeferredLock} per key, kept only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, DeferredLock] = {}

    @asynccontextmanager
    async def holding(self, key: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, DeferredLock())
        await lock.acquire()
        try:
            yield
        finally:
            lock.release()
            if not lock.locked:
                del self._locks[key]
