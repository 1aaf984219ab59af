"""What a llama-server's load output says about device memory: each device's buffers, or that
a device ran out.

llama.cpp logs every buffer it allocates while loading, but the pinned build
only at ``-lv 4``, and runners serve at the default verbosity
(L{mrunner.backends.llamacpp.arguments.placement_args}), so NVML's reading
and the plan measure a runner's GPUs, and these lines count beside them only
where a runner prints them::

    load_tensors:        CUDA0 model buffer size =   92.10 MiB
    load_tensors:   CPU_Mapped model buffer size =   12.00 MiB
    llama_kv_cache:      CUDA0 KV buffer size =   45.00 MiB
    sched_reserve:       CUDA0 compute buffer size =   15.51 MiB
    sched_reserve:   CUDA_Host compute buffer size =    4.01 MiB

A buffer named after a GPU (C{CUDA0}, C{ROCm1}, C{Vulkan0}, C{Metal}) is on
it; C{CPU}, C{CPU_Mapped} and the pinned C{CUDA_Host} buffers are in RAM.
A device that runs out says so in its backend's words (C{cudaMalloc failed:
out of memory}, C{ErrorOutOfDeviceMemory}, C{failed to allocate CUDA0
buffer}) before llama-server exits; those are errors, printed at every verbosity.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from mrunner.values import HOST

MIB = 2**20

_BUFFER = re.compile(r"(\S+)\s+(?:model|KV|RS|compute|output) buffer size =\s*([0-9.]+) MiB")
_HOST_BUFFERS = re.compile(r"^(CPU|\w+_Host)(_|$)")
_GPU_NAME = re.compile(r"^([A-Za-z]+\d*)")
_OUT_OF_MEMORY = re.compile(
    r"out of memory|ErrorOutOfDeviceMemory|failed to allocate (\S+) buffer|"
    r"unable to allocate (\S+) buffer|cudaMalloc failed|hipMalloc failed",
    re.IGNORECASE,
)
_ON_DEVICE = re.compile(r"\bon device (\d+)")
#: The backend an out-of-memory line's words point to, most specific first (a HIP build's
#: messages come from the CUDA code and may say "cuda" too).
_BACKENDS = (
    ("hip", "ROCm"),
    ("rocm", "ROCm"),
    ("vulkan", "Vulkan"),
    ("vk::", "Vulkan"),
    ("metal", "Metal"),
    ("sycl", "SYCL"),
    ("cuda", "CUDA"),
)


@attrs.define
class LoadReport:
    """What the lines read so far said: bytes per device, and the device that ran out, if one did."""

    buffers: dict[str, int] = attrs.Factory(dict)
    out_of_memory: str | None = None

    def read(self, lines: Iterable[str]) -> None:
        for line in lines:
            if match := _BUFFER.search(line):
                device = _device(match[1])
                self.buffers[device] = self.buffers.get(device, 0) + round(float(match[2]) * MIB)
            elif self.out_of_memory is None and (match := _OUT_OF_MEMORY.search(line)):
                named = match[1] or match[2]
                self.out_of_memory = _device(named) if named else _gpu_in(line)


def _device(buffer: str) -> str:
    """The device a buffer's name puts it on: the GPU it names, else the host's RAM."""
    if _HOST_BUFFERS.match(buffer):
        return HOST
    match = _GPU_NAME.match(buffer)
    return match[1] if match else buffer


def _gpu_in(line: str) -> str:
    """The GPU an out-of-memory line names (C{CUDA0} from C{cudaMalloc ... on device 0}), or "a GPU"."""
    lower = line.lower()
    name = next((name for word, name in _BACKENDS if word in lower), None)
    if name is None:
        return "a GPU"
    device = _ON_DEVICE.search(line)
    return f"{name}{device[1] if device else ''}"
