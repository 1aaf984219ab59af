"""How long each model takes to load on this machine, per model digest, kept across restarts.

The plan weighs what an eviction costs by it (L{patience.eviction_order}): a
model that took a minute to load is the last idle one to go. A small JSON
file under C{$MRUNNER_HOME}, written whole (to a new file, then renamed) on
each load; a missing one is started afresh, and so is a damaged one, with a line
in the log: one nested past Python's limit, no regular file (a FIFO would block
the start), or larger than any the daemon writes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from twisted.logger import Logger

from mrunner.home import read_small, write_private

#: The weight of the newest measurement in the running mean: a load from a cold disk is not the rule.
NEWEST = 0.5
#: Models remembered at most; the least recently loaded are forgotten first.
MAX_MODELS = 256
#: The largest file read: MAX_MODELS digests and their seconds take some 25 KiB.
MAX_BYTES = 2**20


class LoadTimes:
    """Seconds each model digest's last loads took, as a running mean; in memory alone without a path."""

    log = Logger()

    def __init__(self, path: Path | None = None):
        self._path = path
        self._seconds: dict[str, float] = self._read(path) if path is not None else {}

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

    def _read(self, path: Path) -> dict[str, float]:
        """The file's times, the last L{MAX_MODELS} of them (the most recently loaded); none if it is
        missing or damaged."""
        try:
            data = json.loads(read_small(path, MAX_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested past the limit
            why = e.strerror if isinstance(e, OSError) else "it is nested too deeply or not JSON"
            self.log.warn("load times in {path} not read ({why}): they start afresh", path=path, why=why)
            return {}
        if not isinstance(data, dict):
            return {}
        times = [(str(k), _seconds(v)) for k, v in data.items()]
        return dict([(k, v) for k, v in times if v is not None][-MAX_MODELS:])


def _seconds(value: object) -> float | None:
    """C{value} as seconds a load took: a finite number, not below zero."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if 0 <= seconds < math.inf else None
