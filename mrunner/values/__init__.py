"""The values the seams speak in: what the scheduler, the API and the metrics pass each other.

Plain frozen records and enums, importing nothing of mrunner, so every layer
can name them without importing another layer's implementation.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

import attrs


class State(Enum):
    """Where a runner is in its life (L{mrunner.runners.lifecycle} has the moves)."""

    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    ENDED = "ended"


@attrs.frozen
class RunnerKey:
    """One runner per (backend, model digest, mode): tags of a digest share it; C{instance}
    numbers the runners of a model configured with C{instances} (0 for the first)."""

    backend: str
    model: str
    mode: str
    instance: int = 0


@attrs.frozen
class ContextSize:
    """A runner's context: what its settings ask for, and what each request really gets.

    llama-server gives a request at most the model's trained context
    (C{<arch>.context_length}), whatever C{--ctx-size} says, and says so only
    in its own log: C{in_force} is that smaller number, which a person must see,
    and the C{--ctx-size} a llama.cpp runner is started with.
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
            f" gets at most {self.in_force} tokens (the context it was trained for), and its runners"
            f" are started with {self.in_force}"
        )


def slots_note(model: str, slots: int, asked: int, context: int | None) -> str:
    """What a person is told when a runner gets fewer slots than C{[scheduler] parallel} asks."""
    each = f"{context} tokens" if context else "a whole context"
    return (
        f"{model} gets {slots} of the {asked} slots asked ({each} each): the memory budget holds"
        " no more; raise [scheduler] memory_budget, or lower its context_size or [scheduler] parallel"
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
    #: Bytes it holds on each device it uses, its GPUs first and C{CPU} (RAM) last: what a
    #: device's C{used} sums.
    devices: Mapping[str, int] = attrs.field(factory=dict)
    #: How many of its layers are offloaded to GPUs.
    gpu_layers: int = 0
    #: Which of its model's runners it is (C{[models."NAME"] instances}), 0 for the first.
    instance: int = 0
    #: The slots C{[scheduler] parallel} asked for when the memory budget gave it fewer, else None.
    slots_asked: int | None = None

    def notes(self) -> str | None:
        """What a person must see of it: a context above the model's, fewer slots than asked."""
        said = [self.context.note(self.model_name)]
        if self.slots_asked is not None:
            said.append(slots_note(self.model_name, self.parallel, self.slots_asked, self.context.in_force))
        return "; ".join(note for note in said if note) or None

    def shares(self) -> str:
        """Where its memory is, as C{"CUDA0 71% / CPU 29%"}: C{"CPU"} when all of it is in RAM."""
        total = sum(self.devices.values())
        if not total or set(self.devices) <= {HOST}:
            return HOST
        shares = (f"{device} {round(100 * size / total)}%" for device, size in self.devices.items() if size)
        return " / ".join(shares)


@attrs.frozen
class Waiting:
    """The requests queued for one model's runner: how many, and how long the oldest has waited."""

    backend: str
    model_name: str
    model_id: str
    mode: str
    count: int
    oldest_seconds: float


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


#: The host's RAM, as a device: where every layer not offloaded lives.
HOST = "CPU"


@attrs.frozen
class Footprint:
    """What a runner needs, in the units llama.cpp places (L{mrunner.backends.llamacpp.sizing.footprint}).

    C{layers} offloadable layers (the repeating blocks and the output layer, as
    C{-ngl} counts them) of C{per_layer} bytes each (weights and KV cache); a
    compute buffer of C{per_device} bytes on each GPU the runner uses; and
    C{host} bytes in RAM however many layers are offloaded (the process, the
    token embeddings, the CPU's compute buffer). A backend that cannot offload
    has no layers: all of it is C{host}. C{offload}, when set, caps the
    layers offloaded: a load that ran out of device memory is retried with fewer.
    """

    host: int
    layers: int = 0
    per_layer: int = 0
    per_device: int = 0
    offload: int | None = None

    @property
    def offloadable(self) -> int:
        """How many layers a placement may put on GPUs."""
        return self.layers if self.offload is None else min(self.layers, self.offload)

    @property
    def total(self) -> int:
        """Bytes with every layer on the CPU: the whole estimate on a machine without a GPU."""
        return self.in_ram(0)

    def in_ram(self, gpu_layers: int) -> int:
        """Bytes left in RAM with C{gpu_layers} layers offloaded."""
        return self.host + (self.layers - gpu_layers) * self.per_layer

    def on_device(self, layers: int) -> int:
        """Bytes a GPU holds for C{layers} of them (none and no compute buffer for none)."""
        return layers * self.per_layer + self.per_device if layers else 0


@attrs.frozen
class Placement:
    """Where one runner's layers go: C{layers} per GPU, in C{--device} order, the rest on the CPU;
    C{memory} is the bytes each device (C{CPU} too) is planned to hold."""

    layers: tuple[tuple[str, int], ...] = ()
    memory: tuple[tuple[str, int], ...] = ()

    @property
    def gpu_layers(self) -> int:
        return sum(n for _, n in self.layers)

    @property
    def on_gpus(self) -> dict[str, int]:
        """Bytes planned on each GPU it uses."""
        return {device: size for device, size in self.memory if device != HOST}

    @property
    def in_ram(self) -> int:
        return dict(self.memory).get(HOST, 0)


def place_on(footprint: Footprint, layers: dict[str, int]) -> Placement:
    """The L{Placement} of C{footprint} with C{layers} on each GPU (in order), the rest in RAM."""
    used = {device: n for device, n in layers.items() if n > 0}
    memory = {HOST: footprint.in_ram(sum(used.values()))}
    memory.update({device: footprint.on_device(n) for device, n in used.items()})
    return Placement(tuple(used.items()), tuple(memory.items()))
