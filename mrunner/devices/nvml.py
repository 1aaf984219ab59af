"""NVML (PyPI ``nvidia-ml-py``), when both the package and the driver's library load.

Optional: without it, free memory comes from running ``llama-server --list-devices``
again. NVML numbers devices as CUDA does by default (PCI bus order, which
llama.cpp's C{CUDA<i>} follows unless C{CUDA_DEVICE_ORDER} says otherwise).
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

log = Logger()


class Nvml:
    """Live memory and compute capability of each NVIDIA GPU, by index."""

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
            for index in range(self._nvml.nvmlDeviceGetCount()):
                info = self._nvml.nvmlDeviceGetMemoryInfo(self._nvml.nvmlDeviceGetHandleByIndex(index))
                found[f"CUDA{index}"] = (int(info.total), int(info.free))
            return found
        except Exception as e:  # NVMLError of any kind: a GPU fell off the bus, the driver was reloaded
            log.warn("NVML failed, using llama-server's device list: {error}", error=e)
            return {}

    def compute_capabilities(self) -> list[str]:
        """Each GPU's compute capability as CMake wants it (C{"89"}), without repeats."""
        try:
            found = []
            for index in range(self._nvml.nvmlDeviceGetCount()):
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(handle)
                found.append(f"{major}{minor}")
            return list(dict.fromkeys(found))
        except Exception:
            return []
