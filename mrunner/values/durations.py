"""Keep-alive values and timestamps that stay inside what a clock and a calendar can hold.

A client's ``keep_alive`` of ``1e308`` seconds used to reach ``callLater`` and
``datetime``, and ``/engines/ps`` and ``/metrics`` answered 500 until the runner
went away. Every keep-alive is normalised here on its way in, and every
timestamp is rendered here on its way out.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

NEVER = -1.0
# Longer than this is "for ever": a year of idling is no timer anyone waits for,
# and it keeps every deadline far inside what datetime and a reactor can represent.
LONGEST_KEEP_ALIVE = 365 * 24 * 3600.0


def keep_alive(seconds: float) -> float:
    """C{seconds} as a runner's keep-alive: negatives and anything past a year mean for ever (-1).

    Non-finite values are refused with C{ValueError}: C{NaN} compares false with
    everything, so a runner given it would never expire and C{ps} would print invalid JSON.
    """
    if not math.isfinite(seconds):
        raise ValueError(f"keep_alive must be a finite number of seconds, not {seconds!r}")
    if seconds < 0 or seconds > LONGEST_KEEP_ALIVE:
        return NEVER
    return seconds


def timestamp(seconds: float | None) -> str | None:
    """C{seconds} since the epoch in ISO 8601 (UTC), or None when there is none to show."""
    if seconds is None or not math.isfinite(seconds):
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC).isoformat()
    except (OverflowError, ValueError, OSError):
        return None
