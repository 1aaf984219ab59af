"""Imports: a GGUF file or a package becomes a stored model in Docker Model Runner's format.

The bytes are staged (written, hashed, their GGUF header read) by an
L{Upload}: as they arrive over HTTP, or copied in a thread from a file. The
commit that follows runs on the reactor: the staged blobs are renamed into
place together with the config and manifest built from their header, so no
collection runs in between, and nothing is left behind when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from mrunner.errors import BadRequest
from mrunner.names import parse
from mrunner.store.artifact import MODEL_CONFIG, Descriptor, Manifest, model_config
from mrunner.store.blobs import Blobs
from mrunner.store.upload import Staged, Upload
from mrunner.values.model import Model, Reference


class Staging(Protocol):
    """The temps of one import: an L{Upload}, or another tool's files linked in; C{taken} by an import."""

    taken: bool

    def discard(self) -> None: ...


#: The store's C{add}: record the model whose blobs are all present, under a reference.
Add = Callable[[Reference, bytes], Model]


class Imports:
    """Stages and commits imports into C{blobs}; C{add} records each model, C{in_thread} runs file work."""

    def __init__(
        self, blobs: Blobs, clock: IReactorTime, in_thread: Callable[..., Deferred[Any]], add: Add
    ) -> None:
        self._blobs = blobs
        self._clock = clock
        self._in_thread = in_thread
        self._add = add

    def upload(self, packaged: bool) -> Upload:
        """Where a GGUF file or (C{packaged}) a package tar is written as it arrives, to be committed by
        L{staged}."""
        return Upload(self._blobs, packaged)

    def gguf(
        self, name: str, source: BinaryIO, licenses: Sequence[bytes], context_size: int | None
    ) -> Deferred[Model]:
        upload = self.upload(packaged=False)
        for text in licenses:
            upload.license(text)
        return self.file(name, upload, source, context_size)

    def file(self, name: str, upload: Upload, source: BinaryIO, context_size: int | None) -> Deferred[Model]:
        """Store as C{name} what C{source} holds, written to C{upload} in a thread."""

        def stage() -> Staged:
            upload.copy(source)
            return upload.staged()

        return self.staged(name, upload, stage, context_size)

    def staged(
        self, name: str, upload: Staging, stage: Callable[[], Staged], context_size: int | None
    ) -> Deferred[Model]:
        """Stage C{upload} in a thread with C{stage}, then commit it; nothing is left behind on failure.

        Cancelling the import (Klein does, when the client goes away) only stops the caller's
        waiting: the thread still holds the files, so the import runs to its end, a commit or a
        removal, and a cancelled caller is never told which.
        """
        upload.taken = True
        done = Deferred.fromCoroutine(self._commit(name, upload, stage, context_size))
        told: Deferred[Model] = Deferred()  # without a canceller: cancelling it fires it at once
        done.addBoth(lambda result: None if told.called else told.callback(result))
        return told

    async def _commit(
        self, name: str, upload: Staging, stage: Callable[[], Staged], context_size: int | None
    ) -> Model:
        try:
            ref = parse(name)
            if ref.digest:
                raise BadRequest(f"import needs a name with a tag, not a digest: {name!r}")
            info, writers = await self._in_thread(stage)
            # committed together, on the reactor: no collection runs in between
            layers = [
                Descriptor(media_type, writer.commit(), writer.offset) for media_type, writer in writers
            ]
        finally:
            upload.discard()  # the temps, now renamed or useless
        described = info.config()
        if context_size is not None:
            described["context_size"] = context_size
        config = model_config(described, self._clock.seconds(), layers)
        self._blobs.put(config)
        manifest = Manifest(Descriptor.of(MODEL_CONFIG, config), tuple(layers))
        return self._add(ref, manifest.to_bytes())
