"""The models named in C{[models] preload}, and how loading each at start went.

Each moves WAITING → LOADING → LOADED | FAILED, and a FAILED one waits again
when a reload names it again; every other move raises L{IllegalMove}. The
scheduler does the loading; this keeps the record, in the order configured.
"""

from __future__ import annotations

from collections.abc import Sequence

from mrunner.moves import Moves
from mrunner.values import Preload, PreloadState

W, L, D, F = PreloadState.WAITING, PreloadState.LOADING, PreloadState.LOADED, PreloadState.FAILED
PRELOAD_MOVES = Moves("preload", {W: frozenset({L}), L: frozenset({D, F}), D: frozenset(), F: frozenset({W})})
del W, L, D, F


class Preloads:
    """The configured preloads by name; their states change only by L{PRELOAD_MOVES}."""

    def __init__(self) -> None:
        self._preloads: dict[str, Preload] = {}

    def all(self) -> list[Preload]:
        return list(self._preloads.values())

    def configure(self, names: Sequence[str]) -> list[str]:
        """Make C{names} the preloads; returns those to load now: new ones, and failed ones again."""
        kept = {name: self._preloads[name] for name in names if name in self._preloads}
        self._preloads = {name: kept.get(name, Preload(name)) for name in names}
        retry = [name for name in names if name in kept and kept[name].state is PreloadState.FAILED]
        for name in retry:
            self._move(kept[name], PreloadState.WAITING)
        return [name for name in names if name not in kept or name in retry]

    def take(self, name: str) -> Preload | None:
        """Begin loading C{name}: its LOADING record; None if it is no preload waiting its turn now."""
        preload = self._preloads.get(name)
        if preload is None or preload.state is not PreloadState.WAITING:
            return None
        return self._move(preload, PreloadState.LOADING)

    def finish(self, loading: Preload, error: str | None = None) -> None:
        """The load that C{take} began is done: LOADED, or FAILED with C{error}.

        Nothing is recorded when a reload has dropped or renewed that preload meanwhile.
        """
        if self._preloads.get(loading.model) is loading:
            self._move(loading, PreloadState.LOADED if error is None else PreloadState.FAILED, error)

    def _move(self, preload: Preload, state: PreloadState, error: str | None = None) -> Preload:
        moved = Preload(preload.model, PRELOAD_MOVES.check(preload.state, state), error)
        self._preloads[preload.model] = moved
        return moved
