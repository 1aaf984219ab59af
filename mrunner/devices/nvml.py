"""NVML (PyPI ``nvidia-ml-py``), when both the package and the driver's library load.

Optional: without it, free memory comes from running ``llama-server --list-devices``
again. NVML numbers devices as CUDA does by default (PCI bus order, which
llama.cpp's C{CUDA<i>} follows unless C{CUDA_DEVICE_ORDER} says otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from twisted.logger import Logger

log = Logger()


class Nvml:
    """Live memory, each process's use and compute capability of each NVIDIA GPU, by index."""

    def __init__(self, module: Any):
        self._nvml = module

    @classmethod
    def load(cls) -> Nvml | None:
        """NVML if C{pynvml} imports and C{nvmlInit} works, else None (no package, no driver)."""
        try:
            import pynvml  # type: ignore[import-not-found,unused-ignore]

            pynvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded...
            log.debug("NVML not used: {error}", error=e)
            return None
        return cls(pynvml)

    def memory(self) -> dict[str, tuple[int, int]]:
        """C{{"CUDA<i>": (total, free)}} in bytes; empty if NVML fails now."""
        try:
            found = {}
            for device, handle in self._gpus():
                info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                found[device] = (int(info.total), int(info.free))
            return found
        except Exception as e:  # NVMLError of any kind: a GPU fell off the bus, the driver was reloaded
            log.warn("NVML failed, using llama-server's device list: {error}", error=e)
            return {}

    def used_by(self, pid: int) -> dict[str, int]:
        """C{{"CUDA<i>": bytes}} process C{pid} holds on each GPU it uses; empty if NVML fails now.

        What the runtime itself takes (its CUDA context, cuBLAS' workspace) is counted
        here and nowhere in llama.cpp's load output. NVML gives None for a process it
        may not look into (another user's, in some containers): that counts as nothing.
        """
        try:
            found: dict[str, int] = {}
            for device, handle in self._gpus():
                for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid == pid and process.usedGpuMemory is not None:
                        found[device] = found.get(device, 0) + int(process.usedGpuMemory)
            return found
        except Exception as e:  # NVMLError of any kind, as in memory()
            log.warn("NVML failed, not measuring runner {pid} on the GPUs: {error}", pid=pid, error=e)
            return {}

    def compute_capabilities(self) -> list[str]:
        """Each GPU's compute capability as CMake wants it (C{"89"}), without repeats."""
        try:
            found = []
            for _, handle in self._gpus():
                major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(handle)
                found.append(f"{major}{minor}")
            return list(dict.fromkeys(found))
        except Exception:
            return []

    def _gpus(self) -> Iterator[tuple[str, Any]]:
        """Each GPU's id (C{CUDA<i>}, as llama.cpp names it) and NVML handle."""
        for index in range(self._nvml.nvmlDeviceGetCount()):
            yield f"CUDA{index}", self._nvml.nvmlDeviceGetHandleByIndex(index)
