"""The responses mrunner made, kept in memory for C{previous_response_id}, retrieval and deletion.

Entries expire after a TTL and the oldest go first when the count or byte
bound is reached, so a busy daemon's memory stays bounded; nothing survives
a restart, as nothing on disk would be a conversation a user did not expect
mrunner to keep.

Each is kept as one compact JSON encoding, decoded when asked for: the bound
counts the memory an entry holds. Kept as Python objects, a Response of
small items held 11 to 18 times its JSON length (89 → 719 MB of RSS under a
64 MiB bound, issue 22).

A response belongs to the key that made it (its SHA-256, L{Caller.owner}):
any other key is told it does not exist, as for one deleted; an admin sees all.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from typing import Any

import attrs
from twisted.internet.interfaces import IReactorTime

from mrunner.api.door.callers import Caller
from mrunner.errors import NotFound

#: What an entry holds besides its encoding: its place in the dict, its id and the tuple around it.
ENTRY_OVERHEAD = 400


@attrs.frozen
class StoredResponse:
    """A response object, the input items it was made from, and the whole conversation up to its output.

    C{conversation} is the chat messages a follow-up with C{previous_response_id}
    starts from (instructions are not carried over, as in OpenAI's API).
    """

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]

    def encode(self) -> bytes:
        parts = [self.response, self.input_items, self.conversation]
        return json.dumps(parts, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def decode(cls, encoded: bytes) -> StoredResponse:
        return cls(*json.loads(encoded))


def memory(encoded: bytes) -> int:
    """The bytes an entry holding C{encoded} takes."""
    return sys.getsizeof(encoded) + ENTRY_OVERHEAD


@attrs.frozen
class _Entry:
    expires: float
    owner: str | None
    encoded: bytes


class ResponseStore:
    """Stored responses by id, for C{ttl} seconds, at most C{max_count} of them and C{max_bytes} of memory."""

    def __init__(self, clock: IReactorTime, ttl: float, max_count: int, max_bytes: int):
        self._clock = clock
        self._ttl = ttl
        self._max_count = max_count
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, stored: StoredResponse, owner: str | None = None) -> None:
        """Keep C{stored} for the key C{owner}, dropping the oldest entries to stay within bounds
        (one too big is not kept)."""
        encoded = stored.encode()
        if memory(encoded) > self._max_bytes or self._max_count <= 0:
            return
        self._entries[stored.response["id"]] = _Entry(self._clock.seconds() + self._ttl, owner, encoded)
        self.bytes += memory(encoded)
        while len(self._entries) > self._max_count or self.bytes > self._max_bytes:
            self._pop_oldest()

    def get(self, response_id: str, caller: Caller) -> StoredResponse:
        return StoredResponse.decode(self._find(response_id, caller).encoded)

    def delete(self, response_id: str, caller: Caller) -> None:
        self._find(response_id, caller)
        self.bytes -= memory(self._entries.pop(response_id).encoded)

    def _find(self, response_id: str, caller: Caller) -> _Entry:
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None or not caller.sees(entry.owner):
            raise NotFound(
                f"response {response_id!r} not found: it was made with store=false or with another key,"
                " deleted, expired, or made before the daemon started",
                code="response_not_found",
            )
        return entry

    def _pop_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.bytes -= memory(entry.encoded)

    def _expire(self) -> None:
        now = self._clock.seconds()
        while self._entries and next(iter(self._entries.values())).expires <= now:
            self._pop_oldest()
