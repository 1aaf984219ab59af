"""The values the seams speak in: what the scheduler, the API and the metrics pass each other.

Plain frozen records and enums, importing nothing of mrunner, so every layer
can name them without importing another layer's implementation.
"""

from __future__ import annotations

from enum import Enum

import attrs


class State(Enum):
    """Where a runner is in its life (L{mrunner.scheduling.lifecycle} has the moves)."""

    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    ENDED = "ended"


@attrs.frozen
class RunnerKey:
    """One runner per (backend, model digest, mode): tags of a digest share it."""

    backend: str
    model: str
    mode: str


@attrs.frozen
class ContextSize:
    """A runner's context: what its settings ask for, and what each request really gets.

    llama-server gives a request at most the model's trained context
    (C{<arch>.context_length}), whatever C{--ctx-size} says, and says so only
    in its own log: C{in_force} is that smaller number, which a person must see.
    """

    asked: int | None = None
    in_force: int | None = None

    @property
    def capped(self) -> bool:
        return self.asked is not None and self.in_force is not None and self.in_force < self.asked

    def note(self, model: str) -> str | None:
        """What a person is told when the context in force is smaller than the one asked for."""
        if not self.capped:
            return None
        return (
            f"context_size {self.asked} for {model} is more than the model will give: each request"
            f" gets at most {self.in_force} tokens (the context it was trained for)"
        )


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


class InstallState(Enum):
    NOT_INSTALLED = "Not Installed"
    INSTALLING = "Installing"
    RUNNING = "Running"
    ERROR = "Error"


@attrs.frozen
class InstallStatus:
    """Where a backend's install is; C{detail} is the version, the progress or the error."""

    state: InstallState = InstallState.NOT_INSTALLED
    detail: str = ""


@attrs.frozen
class ModelSettings:
    """What C{_configure} may change for one model; None keeps the default."""

    context_size: int | None = None
    flags: tuple[str, ...] | None = None
    keep_alive: float | None = None
    pinned: bool | None = None
    #: The name of a model in the store that drafts for speculative decoding; "" for none.
    draft_model: str | None = None

    def over(self, base: ModelSettings) -> ModelSettings:
        """C{base} with what these settings set."""
        return attrs.evolve(
            base, **{k: v for k, v in attrs.asdict(self, recurse=False).items() if v is not None}
        )


@attrs.frozen
class Device:
    """One place a runner's memory lives: a GPU as llama-server names it (C{CUDA0}, C{ROCm0},
    C{Vulkan0}, C{Metal}), or C{CPU} for the host's RAM; sizes in bytes.

    C{budget} is what mrunner lets runners plan for on it; C{used} what its
    runners hold now (measured where it can be, else estimated).
    """

    id: str
    name: str
    memory_total: int
    memory_free: int
    budget: int
    used: int = 0
