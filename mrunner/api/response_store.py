"""The responses mrunner made, kept in memory for C{previous_response_id}, retrieval and deletion.

Entries expire after a TTL and the oldest go first when the count or byte
bound is reached, so a busy daemon's memory stays bounded; nothing survives
a restart, as nothing on disk would be a conversation a user did not expect
mrunner to keep.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import attrs
from twisted.internet.interfaces import IReactorTime

from mrunner.errors import NotFound


@attrs.frozen
class StoredResponse:
    """A response object, the input items it was made from, and the whole conversation up to its output.

    C{conversation} is the chat messages a follow-up with C{previous_response_id}
    starts from (instructions are not carried over, as in OpenAI's API).
    """

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]

    @property
    def size(self) -> int:
        return len(json.dumps([self.response, self.input_items, self.conversation]))


class ResponseStore:
    """Stored responses by id, for C{ttl} seconds, at most C{max_count} of them and C{max_bytes} in all."""

    def __init__(self, clock: IReactorTime, ttl: float, max_count: int, max_bytes: int):
        self._clock = clock
        self._ttl = ttl
        self._max_count = max_count
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[float, int, StoredResponse]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, stored: StoredResponse) -> None:
        """Keep C{stored}, dropping the oldest entries to stay within bounds (one too big is not kept)."""
        size = stored.size
        if size > self._max_bytes or self._max_count <= 0:
            return
        self._entries[stored.response["id"]] = (self._clock.seconds() + self._ttl, size, stored)
        self.bytes += size
        while len(self._entries) > self._max_count or self.bytes > self._max_bytes:
            self._pop_oldest()

    def get(self, response_id: str) -> StoredResponse:
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None:
            raise NotFound(
                f"response {response_id!r} not found: it was made with store=false, deleted, expired,"
                " or made before the daemon started",
                code="response_not_found",
            )
        return entry[2]

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        _, size, _ = self._entries.pop(response_id)
        self.bytes -= size

    def _pop_oldest(self) -> None:
        _, (_, size, _) = self._entries.popitem(last=False)
        self.bytes -= size

    def _expire(self) -> None:
        now = self._clock.seconds()
        while self._entries and next(iter(self._entries.values()))[0] <= now:
            self._pop_oldest()
