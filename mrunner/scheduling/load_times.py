"""How long each model takes to load on this machine, per model digest, kept across restarts.

The plan weighs what an eviction costs by it (L{patience.eviction_order}): a
model that took a minute to load is the last idle one to go. A small JSON
file under C{$MRUNNER_HOME}, written whole (to a new file, then renamed) on
each load; a damaged or missing one is started afresh.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from twisted.logger import Logger

from mrunner.home import write_private

#: The weight of the newest measurement in the running mean: a load from a cold disk is not the rule.
NEWEST = 0.5
#: Models remembered at most; the least recently loaded are forgotten first.
MAX_MODELS = 256


class LoadTimes:
    """Seconds each model digest's last loads took, as a running mean; in memory alone without a path."""

    log = Logger()

    def __init__(self, path: Path | None = None):
        self._path = path
        self._seconds: dict[str, float] = _read(path) if path is not None else {}

    def get(self, digest: str) -> float | None:
        return self._seconds.get(digest)

    def record(self, digest: str, seconds: float) -> None:
        """A load of C{digest} took C{seconds}: into the mean, and onto the disk."""
        old = self._seconds.pop(digest, None)
        self._seconds[digest] = seconds if old is None else old + NEWEST * (seconds - old)
        while len(self._seconds) > MAX_MODELS:
            del self._seconds[next(iter(self._seconds))]
        if self._path is None:
            return
        try:
            partial = self._path.with_suffix(".partial")
            write_private(partial, json.dumps(self._seconds))
            os.replace(partial, self._path)
        except OSError as e:
            self.log.warn("could not keep load times in {path}: {why}", path=self._path, why=e.strerror)


def _read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    numbers = {k: v for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return {str(k): float(v) for k, v in numbers.items() if v >= 0}
