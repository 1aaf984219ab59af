"""Who sent a request, as the routes need to know it: whether an admin, and which key.

The front door (L{mrunner.api.door.trust}) decides this once, with the key check,
and leaves it on the request. A key is kept only as its SHA-256, so what a
route stores (a Response's owner) never holds a key.
"""

from __future__ import annotations

import hashlib

import attrs
from twisted.web.iweb import IRequest

from mrunner.config import ANONYMOUS
from mrunner.teams.members import Member

#: The longest keep-alive a normal key's request may ask for; an admin's is not bounded.
MAX_KEEP_ALIVE = 3600.0


@attrs.frozen
class Caller:
    """C{admin}: reaches the admin routes (every caller, without keys). C{owner}: the key's SHA-256.

    C{member}: the named key's rules (C{[keys."NAME"]}); None for an anonymous key or none.
    C{load_signals_only}: a scrape of C{/metrics} without a valid key, let in by
    C{[cluster] open_metrics}: it sees the load signals, not each key's or model's counts.
    """

    admin: bool
    owner: str | None
    member: Member | None = None
    load_signals_only: bool = False

    @property
    def name(self) -> str:
        """The key's name, as usage, metrics and records show it (never the key)."""
        return ANONYMOUS if self.member is None else self.member.name

    @property
    def rank(self) -> int:
        """The priority class of this caller's requests (0: high)."""
        return 1 if self.member is None else self.member.priority

    def sees(self, owner: str | None) -> bool:
        """Whether this caller may read what the key C{owner} made: its own, or anything as an admin."""
        return self.admin or owner == self.owner

    def keep_alive(self, seconds: float | None) -> float | None:
        """A request's keep-alive (negative: for ever), bounded by L{MAX_KEEP_ALIVE} for a normal key.

        A normal key may keep a model loaded for a while, as Ollama's clients ask,
        but not pin it for ever: only an admin can (C{_configure}, C{tap.conf}).
        """
        if seconds is None or self.admin or 0 <= seconds <= MAX_KEEP_ALIVE:
            return seconds
        return MAX_KEEP_ALIVE


#: A daemon without keys: every caller may do everything, and all share one owner.
OPEN = Caller(admin=True, owner=None)


def key_caller(key: bytes | None, admin: bool, member: Member | None = None) -> Caller:
    return Caller(admin=admin, owner=None if key is None else hashlib.sha256(key).hexdigest(), member=member)


def caller(request: IRequest) -> Caller:
    """The caller the front door found for C{request} (L{OPEN} for one that did not pass it)."""
    found: Caller = getattr(request, "caller", OPEN)
    return found
