"""What a runner holds in memory, as the budget counts it: the plan's estimate as the floor, what
was measured (its resident memory from /proc, its use of each GPU from NVML) once larger."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mrunner.interfaces import IRunnerProcess
from mrunner.values import HOST

#: Seconds between two readings of a runner's resident memory (from /proc) and its use of each GPU
#: (from NVML), which are read when it goes idle.
MEASURE_EVERY = 1.0

#: NVML's bytes for a process on each GPU (L{mrunner.interfaces.IDevices.used_by}).
GpuUse = Callable[[int], Mapping[str, int]]


def unmeasured(pid: int) -> dict[str, int]:
    """No GPU use measured: a machine without NVML."""
    return {}


class Measured:
    """A runner's last readings, taken when it is ready and when it goes idle, at most once every
    L{MEASURE_EVERY} seconds (a busy runner goes idle after each request)."""

    def __init__(self) -> None:
        self.rss = 0
        #: NVML's bytes for its process on each GPU, when last read; none without NVML.
        self.gpus: Mapping[str, int] = {}
        self.at = -MEASURE_EVERY

    def due(self, now: float) -> bool:
        return now - self.at >= MEASURE_EVERY

    def take(self, process: IRunnerProcess, gpu_use: GpuUse, now: float) -> None:
        """Read C{process}'s memory now; a reading that fails keeps the last one."""
        self.rss = process.rss() or self.rss
        pid = process.pid
        if pid is not None:
            self.gpus = gpu_use(pid) or self.gpus
        self.at = now


def held_on_gpus(*readings: Mapping[str, int]) -> dict[str, int]:
    """Bytes a runner holds on each GPU: the largest of its C{readings} (the plan, its load output,
    NVML's use of its process), device by device, as measured RSS corrects the estimate in RAM.

    Each reading misses something the others count (the plan is an estimate, the load output
    leaves out the GPU runtime's own context), so none is trusted below the others. The host's
    RAM (C{CPU}) in a reading is not a GPU and is left out.
    """
    held: dict[str, int] = {}
    for reading in readings:
        for device, size in reading.items():
            if device != HOST:
                held[device] = max(held.get(device, 0), size)
    return held
