"""A load that ran out of device memory: the one retry with a smaller plan, and the error after it."""

from __future__ import annotations

from collections.abc import Callable

import attrs
from twisted.logger import Logger

from mrunner.errors import RunnerFailed
from mrunner.runners.request import LoadRequest
from mrunner.runners.runner import Runner
from mrunner.scheduling import policy

log = Logger()

#: A request with its memory and footprint estimated again for its settings (by its backend).
Estimate = Callable[[LoadRequest], LoadRequest]


def same_estimate(request: LoadRequest) -> LoadRequest:
    """A loader without backends keeps the estimate it was given."""
    return request


def retry(runner: Runner, device: str, estimate: Estimate) -> LoadRequest | None:
    """C{runner}'s request as the next smaller plan (L{policy.smaller}) loads it; None: none is smaller."""
    request, footprint = runner.request, runner.request.footprint
    if footprint is None:
        return None
    smaller = policy.smaller(footprint, runner.gpu_layers, None if request.halved else request.context)
    if smaller is None:
        return None
    if smaller.context is not None:
        request = _smaller_context(runner, smaller.context, estimate)
    if smaller.offload is not None and request.footprint is not None:
        request = attrs.evolve(request, footprint=attrs.evolve(request.footprint, offload=smaller.offload))
    log.warn(
        "runner {key} ran out of memory on {device} with {layers} layers offloaded; trying once more"
        " with {fewer} layers and a context of {context} tokens",
        key=runner.key,
        device=device,
        layers=runner.gpu_layers,
        fewer=runner.gpu_layers if smaller.offload is None else smaller.offload,
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
