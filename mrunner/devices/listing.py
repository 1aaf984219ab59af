"""``llama-server --list-devices``, read: each GPU's id, name, total and free memory.

llama.cpp prints (``common_print_available_devices``, the same in every build)::

    Available devices:
      CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23700 MiB free)

or ``  (none)``. Anything else on the output (a driver's complaint, a half line) is
not a device: a listing with nothing that parses means no GPUs, never an error.

The output is a child's, so it is read as hostile: each line in time linear in its
length and a line over L{MAX_LINE} not at all (a regular expression with two
ambiguous repeats took 28 s of the reactor on one line of 40,000 digits), a device
listed twice or with figures no device has is refused with the reason, and past
L{MAX_DEVICES} devices the rest are counted, not kept.
"""

from __future__ import annotations

import re

import attrs

MIB = 2**20
#: A device line is some 60 characters; one this long is not a device line.
MAX_LINE = 512
#: More GPUs than any machine has; the rest of a longer list is counted and left out.
MAX_DEVICES = 64
#: 16 TiB: more memory than any one device has (or a figure that is not one).
MAX_MIB = 2**24
#: The variant each device id's prefix belongs to (Metal's devices are MTL0..., older builds said Metal).
VARIANTS = {"CUDA": "cuda", "ROCm": "rocm", "Vulkan": "vulkan", "MTL": "metal", "Metal": "metal"}
HEADER = "Available devices:"
NONE = "(none)"
# Each a fullmatch of one unambiguous repeat: linear in the text's length.
_ID = re.compile(r"(?:" + "|".join(VARIANTS) + r")\d*")
_SIZES = re.compile(r"(\d+) MiB, (\d+) MiB free\)")


@attrs.frozen
class Listed:
    """One GPU as a build of llama-server sees it; sizes in bytes."""

    id: str
    name: str
    total: int
    free: int


@attrs.define
class Listing:
    """What a C{--list-devices} output says, read a line at a time (L{feed}).

    C{refused} holds a line for each device line left out and why; C{over} counts the
    devices past L{MAX_DEVICES}.
    """

    devices: list[Listed] = attrs.field(factory=list)
    refused: list[str] = attrs.field(factory=list)
    over: int = 0
    header: bool = False
    none: bool = False

    def feed(self, line: str) -> None:
        """Read one line of the output."""
        if len(line) > MAX_LINE:
            return
        text = line.strip()
        if text == HEADER:
            self.header = True
        elif text == NONE:
            self.none = True
        else:
            self._device(text)

    def looks_like_listing(self) -> bool:
        """Whether the output was a listing at all (with devices or ``(none)``), not garbage."""
        return self.header and bool(self.devices or self.refused or self.over or self.none)

    def _device(self, text: str) -> None:
        ident, colon, rest = text.partition(": ")
        name, paren, sizes = rest.rpartition(" (")
        figures = _SIZES.fullmatch(sizes) if colon and paren and name else None
        if figures is None or not _ID.fullmatch(ident):
            return
        total, free = int(figures[1]), int(figures[2])
        if any(d.id == ident for d in self.devices):
            self.refused.append(f"{ident} is listed twice; the first is kept")
        elif total > MAX_MIB:
            self.refused.append(f"{ident} claims over {MAX_MIB} MiB, more than any device has; left out")
        elif free > total:
            self.refused.append(f"{ident} claims {free} MiB free of {total} MiB; left out")
        elif len(self.devices) >= MAX_DEVICES:
            self.over += 1
        else:
            self.devices.append(Listed(ident, name.strip(), total * MIB, free * MIB))


def read(output: str) -> Listing:
    """The listing in C{output}, read line by line."""
    listing = Listing()
    for line in output.splitlines():
        listing.feed(line)
    return listing


def variant_of(devices: list[Listed]) -> str:
    """The build variant a device list shows: the first device's kind, else C{cpu}."""
    for device in devices:
        return VARIANTS[device.id.rstrip("0123456789")]
    return "cpu"
