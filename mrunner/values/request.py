"""What an inference request asks the scheduler for, resolved once by the API's gateway."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from mrunner.values.model import Model

#: The priority class of a request whose key names none (config.PRIORITIES: high, normal, low).
NORMAL = 1


@attrs.frozen
class Resolved:
    """A request as C{Gateway.begin} decided it, each part once: the scheduler takes it as it is.

    C{backend} is a backend mrunner has (the default one applied); C{model} the
    stored model the request's name stands for (aliases applied); C{keep_alive}
    is what the caller may ask (bounded for a normal key; None: the runner's own),
    and C{rank} its priority class (0 high, 1 normal, 2 low). C{conversation}: its chat
    messages, comparable (L{mrunner.cache.slots.conversation}), by which the instance whose slot
    holds its earlier turn is preferred; empty for any other request.
    """

    backend: str
    model: Model
    mode: str
    keep_alive: float | None = None
    rank: int = NORMAL
    conversation: tuple[object, ...] = ()
    #: The texts it gives the model to read, which a load counts against the context first: read
    #: again from the body on that call, so a request does not hold its decoded prompt while it waits
    #: or streams.
    texts: Callable[[], Sequence[str]] = attrs.field(default=lambda: (), eq=False)
