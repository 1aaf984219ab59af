"""Where a runner's layers go on the GPUs: one that holds them all, else a split, else some in RAM."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from mrunner.values import Footprint, Placement, place_on


def place(footprint: Footprint, room: Mapping[str, float], gpus: Sequence[str]) -> Placement:
    """The best L{Placement} of C{footprint} in C{room} (bytes free on each of C{gpus}).

    Every layer on the one GPU where they fit with the least room to spare,
    so the largest gaps stay for others; else spread over the fewest GPUs,
    largest room first, in proportion to their room (``--tensor-split``);
    else as many layers as fit on them all, the rest in RAM. RAM is not
    checked here: more layers on GPUs always leave less in it. At most
    C{footprint.offloadable} layers are placed on GPUs.
    """
    want = footprint.offloadable
    if not want:
        return place_on(footprint, {})
    fit = {d: _layers_fitting(footprint, room.get(d, 0)) for d in gpus}
    whole = [d for d in gpus if fit[d] >= want]
    if whole:
        return place_on(footprint, {min(whole, key=lambda d: room[d]): want})
    chosen: dict[str, int] = {}
    for device in sorted((d for d in gpus if fit[d] > 0), key=lambda d: -fit[d]):
        if sum(chosen.values()) >= want:
            break
        chosen[device] = fit[device]
    share = _share(want, chosen)
    return place_on(footprint, {d: share[d] for d in gpus if d in share})


def _layers_fitting(footprint: Footprint, room: float) -> int:
    """How many of C{footprint}'s layers C{room} bytes hold, beside a GPU's compute buffer."""
    if room < footprint.per_device + footprint.per_layer:
        return 0
    if not footprint.per_layer or math.isinf(room):
        return footprint.layers
    return min(footprint.layers, int((room - footprint.per_device) // footprint.per_layer))


def _share(layers: int, fitting: Mapping[str, int]) -> dict[str, int]:
    """C{layers} over devices in proportion to how many each holds (largest remainders round up,
    so none gets more than it holds); all they hold when that is fewer."""
    total = sum(fitting.values())
    if total <= layers:
        return dict(fitting)
    share = {d: layers * n // total for d, n in fitting.items()}
    behind = sorted(fitting, key=lambda d: -(layers * fitting[d] % total))  # the largest remainders
    for device in behind[: layers - sum(share.values())]:
        share[device] += 1
    return share
