"""A scheduler asked for a model by name, as C{Gateway.begin} resolves one (without its aliases)."""

from __future__ import annotations

from twisted.internet.defer import Deferred, maybeDeferred

from mrunner.interfaces import ILease, IModelStore, IScheduler
from mrunner.values.request import NORMAL, Resolved


def acquire(
    scheduler: IScheduler,
    store: IModelStore,
    backend: str | None,
    name: str,
    mode: str,
    keep_alive: float | None = None,
    rank: int = NORMAL,
) -> Deferred[ILease]:
    """C{scheduler.acquire} for the model C{name}; a backend or model not found fails the Deferred."""

    def resolved() -> Deferred[ILease]:
        model = store.resolve(name)
        return scheduler.acquire(Resolved(scheduler.backend_name(backend), model, mode, keep_alive, rank))

    return maybeDeferred(resolved)
