"""Devices as llama-server lists them, for the tests of budgets and their hostile inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed

from mrunner.config import GPUConfig
from mrunner.devices.inventory import Devices
from mrunner.devices.listing import MIB, Listed

GIB = 2**30
CUDA0 = Listed("CUDA0", "NVIDIA GeForce RTX 4090", 24080 * MIB, 23700 * MIB)


@attrs.define
class FakeSource:
    """The backend as Devices sees it: a listing, and how often it was asked again."""

    found: list[Listed]
    variant: str = "cuda"
    asked: int = 0
    #: When set, what list_devices answers (a listing still running).
    pending: Deferred[list[Listed]] | None = None

    def listed(self) -> list[Listed]:
        return list(self.found)

    def list_devices(self) -> Deferred[list[Listed]]:
        self.asked += 1
        return self.pending or succeed(self.listed())


def devices(
    found: list[Listed],
    settings: GPUConfig | None = None,
    used: Mapping[str, int] | None = None,
    **kwargs: Any,
) -> tuple[Devices, FakeSource]:
    source = FakeSource(found)
    inventory = Devices(
        source,
        settings or GPUConfig(),
        lambda: 8 * GIB,
        lambda: dict(used or {}),
        host=lambda: (32 * GIB, 20 * GIB),
        **kwargs,
    )
    return inventory, source
