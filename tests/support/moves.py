"""The moves a small lifecycle's table allows, for the tests of each machine."""

from __future__ import annotations

from typing import Any

from mrunner.moves import Moves


def pairs(moves: Moves[Any]) -> set[tuple[Any, Any]]:
    """Every (from, to) a small lifecycle's table allows."""
    return {(now, to) for now, targets in moves.table.items() for to in targets}
