"""One table for every scenario: each path's figure, mrunner's ratios to the baselines, the goal, met or not.

The same rows are written as JSON, so a run can be compared with the next.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PATHS = ("direct", "nginx", "mrunner")
#: mrunner's figure over each baseline's.
RATIOS = ("direct", "nginx")


@dataclass(frozen=True)
class Goal:
    """What mrunner's figure must be, in words and as a test of the row's figures (None: no goal set)."""

    text: str
    test: Callable[[Mapping[str, float]], bool] | None = None


NO_GOAL = Goal("(none set)")


def over(reference: str, allowance: float, unit: str) -> Goal:
    """mrunner at most C{allowance} above C{reference}."""
    return Goal(f"<= {reference} + {allowance:g} {unit}", lambda v: v["mrunner"] <= v[reference] + allowance)


def share(reference: str, fraction: float) -> Goal:
    """mrunner at least C{fraction} of C{reference}."""
    return Goal(f">= {fraction:.0%} of {reference}", lambda v: v["mrunner"] >= fraction * v[reference])


def added(reference: str, fraction: float) -> Goal:
    """What mrunner adds to C{reference} at most C{fraction} of C{reference} itself."""
    return Goal(
        f"added <= {fraction:g} x {reference}",
        lambda v: v["mrunner"] - v[reference] <= fraction * v[reference],
    )


def times(reference: str, factor: float) -> Goal:
    """mrunner at most C{factor} times C{reference} (CPU, memory)."""
    return Goal(f"<= {factor:g} x {reference}", lambda v: v["mrunner"] <= factor * v[reference])


def at_most(limit: float, unit: str = "") -> Goal:
    return Goal(f"<= {limit:g} {unit}".rstrip(), lambda v: v["mrunner"] <= limit)


@dataclass(frozen=True)
class Row:
    """One figure of one scenario, for each path that has it (nginx cannot load a model, say)."""

    scenario: str
    target: str
    values: dict[str, float]
    goal: Goal = NO_GOAL
    details: dict[str, Any] = field(default_factory=dict)

    def ratio(self, reference: str) -> float | None:
        if "mrunner" not in self.values or not self.values.get(reference):
            return None
        return self.values["mrunner"] / self.values[reference]

    def met(self) -> bool | None:
        return None if self.goal.test is None else self.goal.test(self.values)

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "target": self.target,
            "values": self.values,
            "ratios": {f"mrunner/{r}": self.ratio(r) for r in RATIOS},
            "goal": self.goal.text,
            "met": self.met(),
            **({"details": self.details} if self.details else {}),
        }


def number(value: float | None) -> str:
    """A figure with the digits that matter at its size."""
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def table(rows: list[Row]) -> str:
    """The rows, aligned for a terminal, a scenario's name on its first row only."""
    header = ["scenario", "target", *PATHS, *(f"m/{r}" for r in RATIOS), "goal", "met"]
    lines = [header]
    previous = None
    for row in rows:
        met = row.met()
        lines.append(
            [
                row.scenario if row.scenario != previous else "",
                row.target,
                *(number(row.values.get(path)) for path in PATHS),
                *(number(row.ratio(r)) for r in RATIOS),
                row.goal.text,
                "-" if met is None else ("yes" if met else "NO"),
            ]
        )
        previous = row.scenario
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def write_json(meta: dict[str, Any], rows: list[Row], path: Path) -> None:
    path.write_text(json.dumps({**meta, "rows": [row.as_json() for row in rows]}, indent=2) + "\n")
