"""A model found in another tool's folder: its files, where they are, and the names it goes by."""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from mrunner.errors import Unprocessable


class Refused(Unprocessable):
    """A source's layout mrunner will not import from: a file outside its folder, a digest that lies."""

    code = "source_refused"


@attrs.frozen
class SourceFile:
    """One file of a found model; C{digest} is the sha256 the source names it by (checked, not trusted)."""

    path: Path
    digest: str | None = None

    @property
    def size(self) -> int:
        return os.stat(self.path).st_size


@attrs.frozen
class Found:
    """A model in another tool's folder.

    C{ref} is what ``mrunner import`` takes (C{ollama:llama3.2:1b}); C{keys} every spelling of it
    that names this model, lowercased; C{name} the store's name for it unless one is given; C{notes}
    what an import leaves out or decides (a template mrunner does not run).
    C{problem} says why it cannot be imported (the layout was refused); it is listed all the same.
    """

    source: str
    ref: str
    name: str
    where: Path
    weights: tuple[SourceFile, ...] = ()
    projector: SourceFile | None = None
    licenses: tuple[SourceFile, ...] = ()
    notes: tuple[str, ...] = ()
    keys: frozenset[str] = frozenset()
    problem: str | None = None

    @property
    def size(self) -> int:
        """The bytes of its weights and projector; 0 once a file is gone."""
        try:
            return sum(f.size for f in (*self.weights, *([self.projector] if self.projector else [])))
        except OSError:
            return 0

    def check(self) -> Found:
        """@raise Refused: the model's layout was refused when it was found."""
        if self.problem is not None:
            raise Refused(f"{self.ref}: {self.problem}")
        return self
