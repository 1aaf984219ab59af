"""Which llama-server build to use: ``[backends."llama.cpp"] variant``, and ``auto``'s choice.

``auto`` takes the first variant whose toolchain is on C{PATH} and whose device is
present: ``nvcc`` with an NVIDIA device (C{/dev/nvidia0}) → cuda; ``hipcc`` with
C{/dev/kfd} → rocm; ``glslc`` with Vulkan headers new enough for the pinned
llama.cpp → vulkan; else cpu. Each variant builds from the same pinned source
into a directory of its own; the cpu build keeps the directory it always had.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

VARIANTS = ("cpu", "cuda", "rocm", "vulkan")
CHOICES = ("auto", *VARIANTS)
CMAKE_FLAGS = {
    "cpu": (),
    "cuda": ("-DGGML_CUDA=ON",),
    "rocm": ("-DGGML_HIP=ON",),
    "vulkan": ("-DGGML_VULKAN=ON",),
}
#: The oldest ``VK_HEADER_VERSION`` taken as new enough (Vulkan 1.3 headers; the pinned
#: llama.cpp's shaders use 1.3 features).
VULKAN_HEADER_VERSION = 204
VULKAN_HEADERS = (Path("/usr/include/vulkan/vulkan_core.h"), Path("/usr/local/include/vulkan/vulkan_core.h"))
_HEADER_VERSION = re.compile(r"^#define VK_HEADER_VERSION (\d+)\s*$", re.MULTILINE)


class UnknownVariant(ValueError):
    """A C{variant} setting that is none of L{CHOICES}."""


@attrs.frozen
class Machine:
    """What ``auto`` looks at: the toolchains on C{PATH} and the device files present."""

    environ: Mapping[str, str] = attrs.field(factory=lambda: dict(os.environ))
    exists: Callable[[Path], bool] = Path.exists
    vulkan_headers: Sequence[Path] = VULKAN_HEADERS

    def tool(self, name: str) -> str | None:
        return shutil.which(name, path=self.environ.get("PATH", os.defpath))

    def vulkan_version(self) -> int | None:
        """C{VK_HEADER_VERSION} of the first Vulkan header found, None without one."""
        for header in self.vulkan_headers:
            try:
                if match := _HEADER_VERSION.search(header.read_text(errors="replace")):
                    return int(match[1])
            except OSError:
                continue
        return None


def present(variant: str, machine: Machine) -> str | None:
    """None when C{variant} can be built and used here, else why not."""
    if variant == "cuda":
        if machine.tool("nvcc") is None:
            return "nvcc not found on PATH"
        if not machine.exists(Path("/dev/nvidia0")):
            return "no NVIDIA device (/dev/nvidia0)"
    elif variant == "rocm":
        if machine.tool("hipcc") is None:
            return "hipcc not found on PATH"
        if not machine.exists(Path("/dev/kfd")):
            return "no ROCm device (/dev/kfd)"
    elif variant == "vulkan":
        if machine.tool("glslc") is None:
            return "glslc not found on PATH"
        version = machine.vulkan_version()
        if version is None or version < VULKAN_HEADER_VERSION:
            return f"no Vulkan headers of version {VULKAN_HEADER_VERSION} or later"
    return None


def choose(setting: str, machine: Machine) -> str:
    """The variant to build: C{setting} itself, or for ``auto`` the first one L{present} here."""
    if setting not in CHOICES:
        raise UnknownVariant(
            f'[backends."llama.cpp"] variant: expected one of {", ".join(CHOICES)}, got {setting!r}'
        )
    if setting != "auto":
        return setting
    return next((variant for variant in VARIANTS[1:] if present(variant, machine) is None), "cpu")


def directory_name(pin: str, variant: str) -> str:
    """The build's directory under the cache: the pin for cpu (as before variants), C{pin-variant} else."""
    return pin if variant == "cpu" else f"{pin}-{variant}"
