"""Whether a model can load at all within the budgets: checked only when a request needs a load."""

from __future__ import annotations

from collections.abc import Sequence

from mrunner.errors import Unprocessable
from mrunner.runners.request import LoadRequest
from mrunner.scheduling.placing import place
from mrunner.values import Footprint
from mrunner.values.sizes import format_size


def fits(request: LoadRequest, gpus: Sequence[tuple[str, int]], budget: int) -> bool:
    """Whether C{request}'s runner could load on an empty machine (L{check_fits} raises nothing)."""
    try:
        check_fits(request, gpus, budget)
    except Unprocessable:
        return False
    return True


def check_fits(request: LoadRequest, gpus: Sequence[tuple[str, int]], budget: int) -> None:
    """L{Unprocessable} when C{request}'s runner could not load even on an empty machine.

    With GPUs, every GPU's whole budget is its own (L{_check_placed}); else the memory it
    needs is held against the whole memory C{budget} (0: none).
    """
    name, memory, footprint = request.model.name, request.memory, request.footprint
    if gpus and footprint is not None:
        _check_placed(name, footprint, gpus, budget)
    elif budget and memory > budget:
        raise Unprocessable(
            f"model {name} needs about {format_size(memory)} of memory but the whole memory budget"
            f" is {format_size(budget)}; raise [scheduler] memory_budget or use a smaller context size",
            code="model_too_large",
        )


def _check_placed(name: str, footprint: Footprint, gpus: Sequence[tuple[str, int]], budget: int) -> None:
    """L{Unprocessable} naming where C{footprint} falls short with every GPU's whole budget its own."""
    placement = place(footprint, dict(gpus), [device for device, _ in gpus])
    if not budget or placement.in_ram <= budget:
        return
    on_gpus = ", ".join(f"{device} {format_size(size)}" for device, size in placement.on_gpus.items())
    raise Unprocessable(
        f"model {name} needs about {format_size(footprint.total)} of memory; with"
        f" {placement.gpu_layers} of its {footprint.layers} layers on the GPUs ({on_gpus or 'none fits'}),"
        f" CPU needs {format_size(placement.in_ram)}, {format_size(placement.in_ram - budget)} over the"
        f" memory budget of {format_size(budget)}; raise [scheduler] memory_budget or [gpu] memory_budget,"
        " or use a smaller context size",
        code="model_too_large",
    )
