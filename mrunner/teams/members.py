"""Named keys (C{[keys."NAME"]}) as the front door sees them: found by the key, carrying their rules.

A presented key is looked up by its SHA-256 in a dict: the cost is one hash
whatever the number of keys, and the time it takes tells nothing of which key
is near (an attacker would need a preimage of the digest).
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Mapping

import attrs

from mrunner.config import PRIORITIES, KeyConfig
from mrunner.errors import Forbidden
from mrunner.names import normal_name


@attrs.frozen
class Member:
    """A named key's rules. Limits of 0 are none; C{priority} is a class, 0 (C{high}) served first."""

    name: str
    admin: bool = False
    #: Normalised names or glob patterns (C{ai/*}); empty: every model.
    models: tuple[str, ...] = ()
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    tokens_per_day: int = 0
    max_concurrent: int = 0
    priority: int = 1

    def may_use(self, model: str) -> bool:
        """Whether this key may use a model by the name C{model} (a normalised name, or a digest).

        Only a stored model's own names and digest may be asked (L{mrunner.teams.access}): a
        name a client sends may say anything.
        """
        return not self.models or any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    def refusal(self, model: str) -> Forbidden:
        """The 403 for a request of this key for C{model}, which it may not use (or which is not stored)."""
        return Forbidden(
            f"key {self.name!r} may not use model {model}; it may use {', '.join(self.models)}",
            code="model_not_allowed",
        )

    @property
    def limited(self) -> bool:
        """Whether any limit applies: a key without one needs no counting before its requests."""
        return bool(self.requests_per_minute or self.tokens_per_minute or self.tokens_per_day) or bool(
            self.max_concurrent
        )


def member(name: str, entry: KeyConfig) -> Member:
    return Member(
        name=name,
        admin=entry.admin,
        models=tuple(
            model if any(c in model for c in "*?[") else normal_name(model) for model in entry.models
        ),
        requests_per_minute=entry.requests_per_minute,
        tokens_per_minute=entry.tokens_per_minute,
        tokens_per_day=entry.tokens_per_day,
        max_concurrent=entry.max_concurrent,
        priority=PRIORITIES.index(entry.priority),
    )


class KeyRing:
    """The named keys of one configuration, by the SHA-256 of their key."""

    def __init__(self, keys: Mapping[str, KeyConfig]):
        self._by_digest = {
            hashlib.sha256(entry.key.encode()).digest(): member(name, entry)
            for name, entry in keys.items()
            if entry.key
        }

    def __bool__(self) -> bool:
        return bool(self._by_digest)

    def find(self, presented: bytes | None) -> Member | None:
        """The member whose key is C{presented}; None for no key or one that is not named."""
        if presented is None or not self._by_digest:
            return None
        return self._by_digest.get(hashlib.sha256(presented).digest())
