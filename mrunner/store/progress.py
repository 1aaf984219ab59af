"""Progress of a pull or push as Docker Model Runner reports it: one JSON object per line.

A multi-gigabyte download must not become millions of lines, so updates are
throttled per layer: one every 100 ms or every MiB, plus each layer's last byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from mrunner.interfaces import IProgress

INTERVAL = 0.1
MIN_BYTES = 1024 * 1024

Emit = Callable[[dict[str, Any]], None]


@implementer(IProgress)
class Progress:
    """Byte counts as C{{"type", "message", "total", "layer": {"id", "size", "current"}}}."""

    def __init__(self, emit: Emit, clock: IReactorTime, mode: str) -> None:
        self._emit = emit
        self._clock = clock
        self.mode = mode
        self.total = 0
        self.bytes = 0  # moved over the network, for the daemon's metrics
        self._last: dict[str, tuple[float, int]] = {}

    def update(self, layer: str, size: int, current: int) -> None:
        now = self._clock.seconds()
        when, sent = self._last.get(layer, (float("-inf"), 0))
        if now - when < INTERVAL and current - sent < MIN_BYTES and current != size:
            return
        self._last[layer] = (now, current)
        verb = "Downloaded" if self.mode == "pull" else "Uploaded"
        self._emit(
            {
                "type": "progress",
                "message": f"{verb}: {current / 1024 / 1024:.2f} MB",
                "total": self.total,
                "layer": {"id": layer, "size": size, "current": current},
                "mode": self.mode,
            }
        )

    def moved(self, count: int) -> None:
        """C{count} more bytes went over the network (a blob already here moves none)."""
        self.bytes += count

    def success(self, message: str) -> None:
        self._emit({"type": "success", "message": message, "mode": self.mode})

    def error(self, message: str) -> None:
        self._emit({"type": "error", "message": message, "mode": self.mode})
