"""Interleaved rounds: each round measures every path once, the first path rotating.

On a shared machine the background load drifts; measuring A B C, B C A,
C A B ... makes that drift hit every path alike, so the medians and their
ratios hold even when the absolute numbers move.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")
S = TypeVar("S")


def interleave(paths: Mapping[str, T], rounds: int, measure: Callable[[str, T], S]) -> dict[str, list[S]]:
    """C{measure(name, path)} for every path, C{rounds} times, in rotating order; the samples by name."""
    names = list(paths)
    samples: dict[str, list[S]] = {name: [] for name in names}
    for number in range(rounds):
        first = number % len(names)
        for name in names[first:] + names[:first]:
            samples[name].append(measure(name, paths[name]))
    return samples


def medians(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}
