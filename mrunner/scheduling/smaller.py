"""A load that ran out of device memory: the one retry with a smaller plan, and the error after it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs
from twisted.logger import Logger

from mrunner.errors import RunnerFailed
from mrunner.runners.request import LoadRequest
from mrunner.runners.runner import Runner
from mrunner.scheduling.lease import Waiter, first
from mrunner.values import ContextSize, Footprint

log = Logger()

#: The smallest context a load out of device memory is retried with (a model trained for less: that).
MIN_CONTEXT = 2048

#: A request with its memory and footprint estimated again for its settings (by its backend).
Estimate = Callable[[LoadRequest], LoadRequest]


def same_estimate(request: LoadRequest) -> LoadRequest:
    """A loader without backends keeps the estimate it was given."""
    return request


@attrs.frozen
class Smaller:
    """The next smaller plan for a load that ran out of device memory: at most C{offload} layers
    on the GPUs, and a context of C{context} tokens (None: as before)."""

    offload: int | None = None
    context: int | None = None


def smaller(footprint: Footprint, gpu_layers: int, context: ContextSize | None) -> Smaller | None:
    """The one retry of a load that ran out of device memory; None: nothing is smaller, give up.

    A quarter fewer layers on the GPUs (when C{footprint} has no cap, neither the user's nor
    a retry's, and some were offloaded), and half the C{context} (given only when the user
    fixed none and no retry halved it), not below L{MIN_CONTEXT} or the context in force if
    that is less: a model answers with a smaller context, but not with one smaller than a chat
    needs. Both at once, so that one retry is the only one: a retried plan has its cap, and
    its context halved or fixed.
    """
    fewer = gpu_layers * 3 // 4 if footprint.offload is None and gpu_layers else None
    half = None
    if context is not None and context.asked is not None:
        half = max(context.asked // 2, min(MIN_CONTEXT, context.in_force or MIN_CONTEXT))
        half = half if half < context.asked else None
    return None if fewer is None and half is None else Smaller(offload=fewer, context=half)


def retry_waiters(runner: Runner, device: str, estimate: Estimate, queue: Iterable[Waiter]) -> bool:
    """Plan again for C{runner}'s waiters in C{queue} with the next smaller plan (L{retry}), if any."""
    request = retry(runner, device, estimate)
    if request is None:
        return False
    for waiter in queue:
        if waiter.key == first(runner.key):
            waiter.request = request
    return True


def retry(runner: Runner, device: str, estimate: Estimate) -> LoadRequest | None:
    """C{runner}'s request as the next smaller plan (L{smaller}) loads it; None: none is smaller."""
    request, footprint = runner.request, runner.request.footprint
    if footprint is None:
        return None
    less = smaller(footprint, runner.gpu_layers, None if request.halved else request.context)
    if less is None:
        return None
    if less.context is not None:
        request = _smaller_context(runner, less.context, estimate)
    if less.offload is not None and request.footprint is not None:
        request = attrs.evolve(request, footprint=attrs.evolve(request.footprint, offload=less.offload))
    log.warn(
        "runner {key} ran out of memory on {device} with {layers} layers offloaded; trying once more"
        " with {fewer} layers and a context of {context} tokens",
        key=runner.key,
        device=device,
        layers=runner.gpu_layers,
        fewer=runner.gpu_layers if less.offload is None else less.offload,
        context=request.settings.context_size or "the model's",
    )
    return request


def _smaller_context(runner: Runner, context: int, estimate: Estimate) -> LoadRequest:
    """C{runner}'s request with a context of C{context} tokens, estimated again, and no more
    layers on the GPUs than it had (a smaller context is not a reason to offload more)."""
    request = runner.request
    smaller = estimate(attrs.evolve(request, settings=attrs.evolve(request.settings, context_size=context)))
    if smaller.footprint is None:
        return smaller
    return attrs.evolve(smaller, footprint=attrs.evolve(smaller.footprint, offload=runner.gpu_layers))


def out_of_memory(runner: Runner, device: str, output: str) -> RunnerFailed:
    """The error for a runner that ran out of C{device}'s memory while loading, even with fewer
    layers (and half the context, when no context size was set)."""
    request = runner.request
    halved = f" and its context halved to {request.settings.context_size} tokens" if request.halved else ""
    return RunnerFailed(
        f"model {runner.model_name} ran out of memory on {device} while loading, with"
        f" {runner.gpu_layers} layers offloaded{halved}; lower [gpu] memory_budget for {device}, or use a"
        f" smaller context size ({output})"
    )
