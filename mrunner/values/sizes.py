"""Sizes in words, as Docker Model Runner shows them: ``256.35 MiB``."""

from __future__ import annotations

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_size(size: float) -> str:
    """C{1.50 MiB}, in the largest unit under 1024; bytes are counted exactly."""
    value = float(size)
    for unit in UNITS:
        if abs(value) < 1024 or unit == UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
