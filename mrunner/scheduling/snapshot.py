"""Frozen views of the scheduler's state: what C{/engines/ps}, C{/metrics} and C{/ready} render."""

from __future__ import annotations

from enum import Enum

import attrs

from mrunner.backends.base import ContextSize
from mrunner.scheduling.lifecycle import State


@attrs.frozen
class RunnerSnapshot:
    """One runner at one moment; times are seconds since the epoch, C{keep_alive} -1 means for ever."""

    backend: str
    model_name: str
    model_id: str
    mode: str
    state: State
    in_use: int
    parallel: int
    last_used: float
    keep_alive: float
    expires_at: float | None
    memory: int
    memory_estimate: int
    memory_measured: int | None
    pid: int | None
    socket: str
    pinned: bool
    stale: bool
    #: The context its settings ask for, and what llama-server gives each request.
    context: ContextSize = attrs.Factory(ContextSize)


class PreloadState(Enum):
    WAITING = "waiting"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@attrs.frozen
class Preload:
    """A model named in C{[models] preload} and how loading it at start went."""

    model: str
    state: PreloadState = PreloadState.WAITING
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.state in (PreloadState.LOADED, PreloadState.FAILED)
