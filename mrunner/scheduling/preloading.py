"""Loading C{[models] preload} at start and at each reload, pulling a preload the store lacks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import attrs
from twisted.internet.defer import ensureDeferred
from twisted.logger import Logger

from mrunner.errors import MrunnerError, NotFound, Unprocessable
from mrunner.interfaces import IModelStore
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.preloads import Preloads
from mrunner.scheduling.requests import Requests
from mrunner.values import Preload
from mrunner.values.backend import default_use
from mrunner.values.request import Resolved
from mrunner.values.sizes import format_size

#: Fetches a model that is not in the store from its registry (a preload's, at start).
PullModel = Callable[[str], Awaitable[object]]


@attrs.define
class Preloader:
    """Loads the preloads in order, once the backend is installed; one that fails is reported, not fatal."""

    log = Logger()

    _store: IModelStore
    _requests: Requests
    _loader: Loader
    #: The default backend's name, which preloads load with.
    _backend: Callable[[], str]
    _pull: PullModel | None = None
    _preloads: Preloads = attrs.field(factory=Preloads, init=False)

    def all(self) -> list[Preload]:
        return self._preloads.all()

    def configure(self, names: Sequence[str]) -> None:
        """Make C{names} the preloads, and load the new ones (and failed ones again)."""
        new = self._preloads.configure(names)
        if new:
            ensureDeferred(self._each(new))

    async def _each(self, names: Sequence[str]) -> None:
        for name in names:
            loading = self._preloads.take(name)
            if loading is None:
                continue  # dropped by a reload meanwhile, or another reload's loading it
            try:
                await self._one(name)
            except MrunnerError as e:
                self.log.warn("preloading {model} failed: {error}", model=name, error=e.message)
                self._preloads.finish(loading, e.message)
            except Exception as e:
                self.log.failure("preloading {model} failed", model=name)
                self._preloads.finish(loading, f"preloading {name} failed: {e}")
            else:
                self.log.info("preloaded {model}", model=name)
                self._preloads.finish(loading)

    async def _one(self, name: str) -> None:
        await self._pull_missing(name)
        model = self._store.resolve(name)
        backend, mode = default_use(model, self._backend())
        asked = Resolved(backend, model, mode)
        request = await self._requests.build(asked, install_wait=None)
        if request.key not in self._loader.runners and not self._loader.fits(
            request.memory, request.footprint
        ):
            raise Unprocessable(
                f"preload {name} does not fit beside the runners already loaded"
                f" ({format_size(request.memory)} needed); raise [scheduler] memory_budget or max_runners",
                code="preload_does_not_fit",
            )
        lease = await self._loader.acquire(request)
        lease.release()

    async def _pull_missing(self, name: str) -> None:
        """Pull a preload the store does not have, so a new node needs only its tap.conf and a registry."""
        try:
            self._store.resolve(name)
        except NotFound:
            if self._pull is None:
                raise
            self.log.info("preload {model} is not in the store: pulling it", model=name)
            await self._pull(name)
