"""What a runner is started for: its key, its model and settings, its keep-alive, what it needs."""

from __future__ import annotations

import attrs

from mrunner.values import ContextSize, Footprint, RunnerKey
from mrunner.values.backend import RunnerSettings
from mrunner.values.model import Model


@attrs.frozen
class LoadRequest:
    """What a request needs: the runner key and how to start it if it is not running."""

    key: RunnerKey
    model: Model
    settings: RunnerSettings
    keep_alive: float
    memory: int = 0
    sets_keep_alive: bool = False
    pinned: bool = False
    #: C{memory} split per layer, for a plan over GPUs; None: all of it in RAM.
    footprint: Footprint | None = None
    #: How many runners of the model may serve (C{[models."NAME"] instances}).
    instances: int = 1
    #: The context in force when the user fixed no context size, which a load out of device
    #: memory may halve once (C{settings.context_size} then holds the half); None when fixed.
    context: ContextSize | None = None
    #: The request's chat messages, comparable (L{mrunner.values.request.Resolved}), which a runner's
    #: slot may hold: the loader prefers that instance (L{mrunner.scheduling.loader.Loader.prefer}).
    conversation: tuple[object, ...] = attrs.field(default=(), eq=False)
    #: The slots the settings asked for when the memory budget gave fewer (C{settings.parallel}
    #: holds those: L{mrunner.scheduling.slots}); None when it gave them all.
    slots_asked: int | None = None

    @property
    def halved(self) -> bool:
        """Whether a load out of device memory halved the context the user left to mrunner."""
        return self.context is not None and self.settings.context_size is not None

    @property
    def asked(self) -> RunnerSettings:
        """The settings as configured, before a load out of device memory halved the context and
        the memory budget cut the slots."""
        settings = attrs.evolve(self.settings, context_size=None) if self.halved else self.settings
        if self.slots_asked is not None:
            settings = attrs.evolve(settings, parallel=self.slots_asked)
        return settings
