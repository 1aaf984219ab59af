"""``llama-server --list-devices``, read: each GPU's id, name, total and free memory.

llama.cpp prints (``common_print_available_devices``, the same in every build)::

    Available devices:
      CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23700 MiB free)

or ``  (none)``. Anything else on the output (a driver's complaint, a half line) is
not a device: a listing with nothing that parses means no GPUs, never an error.
"""

from __future__ import annotations

import re

import attrs

MIB = 2**20
_DEVICE = re.compile(
    r"^\s*(?P<id>[A-Za-z][\w.-]*?\d*): (?P<name>.+?) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$"
)
#: The variant each device id's prefix belongs to (Metal's devices are MTL0..., older builds said Metal).
VARIANTS = {"CUDA": "cuda", "ROCm": "rocm", "Vulkan": "vulkan", "MTL": "metal", "Metal": "metal"}


@attrs.frozen
class Listed:
    """One GPU as a build of llama-server sees it; sizes in bytes."""

    id: str
    name: str
    total: int
    free: int


def parse(output: str) -> list[Listed]:
    """The devices in C{output}, in order; lines that are not a device line are skipped."""
    found = []
    for line in output.splitlines():
        match = _DEVICE.match(line)
        if match and _prefix(match["id"]) in VARIANTS:
            found.append(
                Listed(match["id"], match["name"], int(match["total"]) * MIB, int(match["free"]) * MIB)
            )
    return found


def looks_like_listing(output: str) -> bool:
    """Whether C{output} is a listing at all (with devices or ``(none)``), not garbage."""
    lines = [line.strip() for line in output.splitlines()]
    return "Available devices:" in lines and (bool(parse(output)) or "(none)" in lines)


def variant_of(devices: list[Listed]) -> str:
    """The build variant a device list shows: the first device's kind, else C{cpu}."""
    for device in devices:
        return VARIANTS[_prefix(device.id)]
    return "cpu"


def _prefix(ident: str) -> str:
    return ident.rstrip("0123456789")
