"""One lock per blob digest, so work on one blob (a download, a hash) is done once at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from twisted.internet.defer import DeferredLock


class _Kept:
    """A key's lock and how many hold or wait for it: the entry goes when the last of them leaves."""

    def __init__(self) -> None:
        self.lock = DeferredLock()
        self.users = 0


class KeyedLocks:
    """A C{DeferredLock} per key, kept only while someone holds or waits for it.

    The entry is counted, not judged by C{lock.locked}: a release runs the next
    waiter's block at once, which may end and leave before the releaser does.
    """

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    @asynccontextmanager
    async def holding(self, key: str) -> AsyncIterator[None]:
        kept = self._kept.setdefault(key, _Kept())
        kept.users += 1
        try:
            async with kept.lock:
                yield
        finally:
            kept.users -= 1
            if not kept.users:
                del self._kept[key]
