"""A guard for small lifecycles: which state may follow which, as a table, and one error for the rest.

The runner's own machine (L{mrunner.runners.lifecycle}) lists its outputs
too, and owns its readiness; the smaller lifecycles (a backend's install, a
preload) only need their moves checked, so a bug shows up where it happens
instead of as, say, an install that is both running and failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Generic, TypeVar

S = TypeVar("S", bound=Enum)


class IllegalMove(Exception):
    """A transition a lifecycle does not have, e.g. READY after STOPPING."""


class Moves(Generic[S]):
    """The states each state may move to; C{check} refuses every other move."""

    def __init__(self, name: str, table: Mapping[S, frozenset[S]]):
        self.name = name
        self.table = table

    def check(self, now: S, to: S) -> S:
        """C{to}, if C{now} may move there; else L{IllegalMove}."""
        if to not in self.table[now]:
            raise IllegalMove(f"a {self.name} cannot go from {now.name.lower()} to {to.name.lower()}")
        return to
