"""Delete, pull and push models, as every API that manages them does: C{/models} and Ollama's C{/api}.

The two APIs differ only in how they report; the rules are here once: the last
name of a model takes the model with it only after its runners stop (refused
while they serve, unless forced), and every pull and push counts the bytes it
moved in C{/metrics}, however it was asked for and however it ends.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from twisted.internet.interfaces import IReactorTime

from mrunner.errors import Conflict
from mrunner.interfaces import IModelPuller, IModelPusher, IModelStoreAdmin, IProgress, IScheduler
from mrunner.names import parse
from mrunner.store.progress import Emit, Progress
from mrunner.values import State
from mrunner.values.model import Deletion, Reference

Moved = Callable[[str, int], None]


@attrs.frozen
class ModelOperations:
    """What changes the models on disk for a request, with the scheduler and the metrics told.

    C{moved(mode, bytes)} is told what each pull or push moved over the network; C{removed()}
    that a model's files are gone (the prompt cache then removes the states saved for them).
    """

    _store: IModelStoreAdmin
    _scheduler: IScheduler
    _puller: IModelPuller
    _pusher: IModelPusher
    _clock: IReactorTime
    _moved: Moved = lambda mode, count: None
    _removed: Callable[[], object] = lambda: None

    def progress(self, emit: Emit, mode: str) -> IProgress:
        """The L{Progress} of a pull or push (C{mode}), as lines given to C{emit}."""
        return Progress(emit, self._clock, mode)

    async def delete(self, name: str, force: bool) -> Deletion:
        """Remove the name C{name} (L{IModelStoreAdmin.delete}); the last name takes the model, after its
        runners stop.

        @raise Conflict: a runner serves the model (or is loading it) and C{force} is false; with it,
            the runner finishes its answers, then stops.
        """
        digest, whole_model = self._store.deletion(name, force)
        if whole_model:
            busy = sum(
                r.in_use + (r.state is State.LOADING)
                for r in self._scheduler.snapshot()
                if r.model_id == digest
            )
            if busy and not force:
                raise Conflict(
                    f"model {name} is in use: a runner is serving it ({busy} request(s) or a load); delete"
                    " with force=true to remove it once they end",
                    code="model_in_use",
                )
            await self._scheduler.unload(backend=None, models=[digest], all=False)
        deletion = self._store.delete(name, force)
        if whole_model:
            self._removed()
        return deletion

    async def pull(self, ref: Reference, progress: IProgress) -> None:
        """Fetch C{ref} into the store, telling C{progress}; the bytes moved are counted."""
        try:
            await self._puller.pull(ref, progress)
        finally:
            self._moved("pull", progress.bytes)

    def pushable(self, name: str) -> Reference:
        """Where the local model C{name} would be pushed; checked before any progress is reported.

        @raise NotFound: there is no model C{name} here.
        """
        ref = parse(name)
        self._store.resolve(name)
        return ref

    async def push(self, ref: Reference, progress: IProgress) -> None:
        """Push the model named C{ref} (L{pushable}) to its registry; the bytes moved are counted."""
        try:
            await self._pusher.push(ref, progress)
        finally:
            self._moved("push", progress.bytes)
