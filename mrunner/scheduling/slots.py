"""How many slots a runner gets: a whole context each, as many as asked where the budgets hold them.

A context size is what one request may use, so a runner's KV pool holds one
context per slot and grows with them. The one rule where the memory budgets
cannot hold C{parallel} whole contexts: the most slots, down to one, whose
runner fits them on an empty machine (L{fitting.fits}); never a part of a
context. A model that does not fit with one slot is the 422 it always was.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from twisted.logger import Logger

from mrunner.runners.request import LoadRequest
from mrunner.values import RunnerKey, slots_note

#: A request with its memory and footprint estimated again for its settings (by its backend).
Estimate = Callable[[LoadRequest], LoadRequest]
#: Whether a request's runner fits the budgets on an empty machine.
Fits = Callable[[LoadRequest], bool]


def fitted_slots(request: LoadRequest, estimate: Estimate, fits: Fits) -> LoadRequest:
    """C{request} (estimated for its settings' C{parallel}) with the most slots that fit, at least one.

    A request given fewer slots than asked keeps the number asked in C{slots_asked}.
    """
    asked = request.settings.parallel
    if asked <= 1 or fits(request):
        return request
    for slots in range(asked - 1, 0, -1):
        fewer = estimate(attrs.evolve(request, settings=attrs.evolve(request.settings, parallel=slots)))
        fewer = attrs.evolve(fewer, slots_asked=asked)
        if slots == 1 or fits(fewer):
            return fewer
    raise AssertionError("unreachable: one slot is always returned")


class SlotNotes:
    """Logs, once per runner key and number, that its runner gets fewer slots than asked."""

    log = Logger()

    def __init__(self) -> None:
        self._said: dict[RunnerKey, int] = {}

    def __call__(self, request: LoadRequest, context: int | None) -> None:
        slots = request.settings.parallel
        if request.slots_asked is None or self._said.get(request.key) == slots:
            return
        self._said[request.key] = slots
        self.log.warn("{note}", note=slots_note(request.model.name, slots, request.slots_asked, context))
