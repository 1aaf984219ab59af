"""What each slot of a live runner holds, as mrunner sent it: which slot a conversation's next turn takes.

A conversation is its messages in order, each as a comparable value (L{conversation}); a
slot holds the one its last request sent. A turn goes to the free slot that
holds a prefix of its conversation (its earlier turn), else to the free slot
sharing the most of it (a system prompt), else to an empty one, else to the one
least recently used, the requester's before another key's. A slot that holds
another key's tokens is erased before it serves a turn (L{Slot.foreign}):
llama-server would reuse what the prompts share, and its cached token count and
timings would tell the requester how much of another key's prompt it guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

Conversation = tuple[object, ...]

CHAT = b"/v1/chat/completions"
MESSAGES = b"/v1/messages"  # Anthropic's
COMPLETIONS = b"/v1/completions"


def conversation(path: bytes, payload: Mapping[str, Any]) -> Conversation | None:
    """C{payload}'s conversation: each chat message (and Anthropic's system) as a comparable value, or
    a completion prompt's lines; None for another shape (a list of prompts, tokens) or path (OpenAI's
    and Anthropic's, under any prefix), and for a payload that names its slot itself (C{id_slot})."""
    if "id_slot" in payload:
        return None
    if path.endswith((CHAT, MESSAGES)) and isinstance(payload.get("messages"), list):
        system = (_part(payload["system"]),) if "system" in payload else ()
        return system + tuple(_part(m) for m in payload["messages"])
    if path.endswith(COMPLETIONS) and isinstance(payload.get("prompt"), str):
        return tuple(payload["prompt"].splitlines(keepends=True))
    return None


def _part(message: object) -> object:
    """A message as a value to compare: its fields, when all are text (the common case, at the cost
    of a tuple), else its canonical JSON."""
    if isinstance(message, dict) and all(isinstance(v, str) for v in message.values()):
        return tuple(sorted(message.items()))
    return json.dumps(message, sort_keys=True)


@attrs.define(eq=False)
class Slot:
    id: int
    busy: bool = False
    held: Conversation = ()
    owner: str | None = None
    used: float = 0.0
    #: Nothing in it since the runner started or mrunner erased it.
    blank: bool = True

    def foreign(self, owner: str | None) -> bool:
        """Whether it may hold tokens of a key other than C{owner}: they must not serve its turn."""
        return not self.blank and self.owner != owner

    def erased(self) -> None:
        self.blank, self.held, self.owner = True, (), None

    def shared(self, parts: Conversation) -> int:
        """How many parts of C{parts} this slot's conversation begins with."""
        n = 0
        for mine, theirs in zip(self.held, parts, strict=False):
            if mine != theirs:
                break
            n += 1
        return n


class Slots:
    """One runner's slots, as mrunner hands them out."""

    def __init__(self, parallel: int):
        self.all = [Slot(n) for n in range(max(1, parallel))]

    def __getitem__(self, n: int) -> Slot:
        return self.all[n % len(self.all)]

    def holds(self, parts: Conversation) -> bool:
        """Whether a free slot holds an earlier turn of C{parts}, whoever's (the instance to prefer)."""
        return any(not s.busy and s.held and s.shared(parts) == len(s.held) for s in self.all)

    def holding(self, parts: Conversation, owner: str | None) -> Slot | None:
        """The free slot of C{owner} whose whole conversation begins C{parts}, the longest."""
        held = [s for s in self._free(owner) if s.held and s.shared(parts) == len(s.held)]
        return max(held, key=lambda s: len(s.held), default=None)

    def nearest(self, parts: Conversation, owner: str | None) -> Slot | None:
        """The free slot sharing the most of C{parts} (of C{owner}'s), else L{spare}."""
        near = max(self._free(owner), key=lambda s: (s.shared(parts), not s.held, -s.used), default=None)
        return near if near is not None and near.shared(parts) else self.spare(owner)

    def spare(self, owner: str | None) -> Slot | None:
        """A free slot whose loss costs least: an empty one, else the least recently used of
        C{owner}'s, else of another key's (to be erased first)."""
        free = [s for s in self.all if not s.busy]
        return min(free, key=lambda s: (not s.blank, s.foreign(owner), s.used), default=None)

    def _free(self, owner: str | None) -> list[Slot]:
        return [s for s in self.all if not s.busy and s.owner == owner]
