"""How listings are shown: aligned tables for people, JSON for scripts, sizes and times in words."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

DURATIONS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def plural(count: int, noun: str) -> str:
    """C{1 runner}, C{2 runners}, C{0 runners}: a count and its noun, as English says it."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def duration(seconds: float) -> str:
    """The largest whole unit: C{3 minutes}, C{1 hour}."""
    for unit, length in DURATIONS:
        if seconds >= length:
            return plural(int(seconds // length), unit)
    return "0 seconds"


def ago(then: float, now: float) -> str:
    return "just now" if now - then < 1 else f"{duration(now - then)} ago"


def table(console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns aligned under upper-case headers, as docker and ollama list things."""
    grid = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    for header in headers:
        grid.add_column(header.upper(), no_wrap=True)
    for row in rows:
        grid.add_row(*(Text(cell) for cell in row))  # Text: a name is never markup
    console.print(grid, markup=False, highlight=False)


def show_json(console: Console, value: Any) -> None:
    """Indented JSON, uncoloured and unwrapped, for scripts."""
    console.file.write(json.dumps(value, indent=2) + "\n")
