"""Progress a person can watch: one bar per layer of a pull or push, and a backend being installed.

In a terminal these are live bars and spinners; written to a pipe or a file
they become plain lines, few enough to read in a log.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from mrunner.cli.client import Daemon
from mrunner.values.sizes import format_size

PLAIN_STEPS = 4  # a plain line at each quarter of a layer
INSTALL_POLL_SECONDS = 0.5


class LayerProgress:
    """Shows C{update(layer, size, current)} calls made inside its C{with} block."""

    def __enter__(self) -> LayerProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def update(self, layer: str, size: int, current: int) -> None:
        raise NotImplementedError


def layer_progress(console: Console, verb: str) -> LayerProgress:
    """Bars in a terminal, plain lines elsewhere; C{verb} (C{pull}, C{push}) starts each plain line."""
    return LayerBars(console) if console.is_terminal else PlainLayers(console, verb)


def layer_label(layer: str) -> str:
    """A layer's short name, as docker shows it: 12 hex digits of its digest."""
    return layer.split(":", 1)[-1][:12]


class LayerBars(LayerProgress):
    """One rich bar per layer: bytes done of its size, speed and time left."""

    def __init__(self, console: Console) -> None:
        self._bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> LayerBars:
        self._bars.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._bars.stop()

    def update(self, layer: str, size: int, current: int) -> None:
        if layer not in self._tasks:
            self._tasks[layer] = self._bars.add_task(layer_label(layer), total=size)
        self._bars.update(self._tasks[layer], completed=current)


class PlainLayers(LayerProgress):
    """A line when a layer starts, at each quarter, and when it is complete."""

    def __init__(self, console: Console, verb: str) -> None:
        self._console = console
        self._verb = verb
        self._shown: dict[str, int] = {}

    def update(self, layer: str, size: int, current: int) -> None:
        step = PLAIN_STEPS if current >= size else current * PLAIN_STEPS // max(size, 1)
        if self._shown.get(layer, -1) >= step:
            return
        self._shown[layer] = step
        percent = 100 if current >= size else current * 100 // max(size, 1)
        self._console.print(
            f"{self._verb} {layer_label(layer)}: {format_size(current)} of {format_size(size)} ({percent}%)",
            markup=False,
            highlight=False,
        )


def wait_for_install(daemon: Daemon, console: Console) -> None:
    """Show each installing backend's progress until none is installing (installed, or failed)."""

    def installing() -> dict[str, str]:
        statuses: dict[str, str] = daemon.call("GET", "/engines/status")
        return {name: status for name, status in statuses.items() if status.startswith("Installing")}

    shown: dict[str, str] = {}
    with console.status("installing the backend") if console.is_terminal else nullcontext() as spinner:
        while pending := installing():
            text = "; ".join(f"backend {name}: {status}" for name, status in pending.items())
            if spinner is not None:
                spinner.update(text)
            elif pending != shown:
                console.print(text, markup=False, highlight=False)
            shown = pending
            time.sleep(INSTALL_POLL_SECONDS)
