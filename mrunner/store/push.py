"""Push a stored model to a registry: the blobs it lacks, then the manifest under the tag."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, BinaryIO

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IConsumer, IReactorTime
from twisted.internet.task import Cooperator
from twisted.logger import Logger
from twisted.web.client import FileBodyProducer
from zope.interface import implementer

from mrunner.errors import BadRequest
from mrunner.interfaces import IModelPusher, IProgress
from mrunner.store.artifact import Descriptor
from mrunner.store.huggingface import is_hub
from mrunner.store.local import ModelStore
from mrunner.store.registry import RegistryClient, Repository
from mrunner.values.model import Reference


@implementer(IModelPusher)
class Pusher:
    """Uploads models; blobs are streamed from disk, never read whole into memory."""

    log = Logger()

    def __init__(self, store: ModelStore, client: RegistryClient, reactor: IReactorTime) -> None:
        self._store = store
        self._client = client
        # Reads the file in small steps between other reactor work, on the injected reactor.
        self._cooperator = Cooperator(scheduler=lambda step: reactor.callLater(0, step))

    def push(self, ref: Reference, progress: IProgress) -> Deferred[str]:
        """Push the model named C{ref} to C{ref}'s registry; fires with the manifest digest."""
        return Deferred.fromCoroutine(self._push(ref, progress))

    async def _push(self, ref: Reference, progress: IProgress) -> str:
        if not ref.tag:
            raise BadRequest(f"push needs a tag to push to, not a digest: {ref}")
        if is_hub(ref):
            raise BadRequest(
                f"{ref} names a Hugging Face repository, which mrunner pulls from but does not push to;"
                " tag the model with a registry name (mrunner tag) and push that",
                code="push_to_hub",
            )
        digest = self._store.lookup(str(ref))
        manifest = self._store.manifest(digest)
        repo = self._client.repositories(ref, pull=False)[0]
        progress.total = sum(blob.size for blob in manifest.blobs)
        with self._store.keeping([digest, *(blob.digest for blob in manifest.blobs)]):
            for blob in manifest.blobs:
                if not await self._client.has_blob(repo, blob.digest):
                    await self._upload(repo, blob, progress)
                progress.update(blob.digest, blob.size, blob.size)
            await self._client.put_manifest(
                repo, ref.tag, self._store.manifest_bytes(digest), manifest.media_type
            )
        self.log.info("pushed {ref} ({digest}) to {host}", ref=ref, digest=digest, host=repo.host)
        return digest

    async def _upload(self, repo: Repository, blob: Descriptor, progress: IProgress) -> None:
        path = self._store.blobs.path(blob.digest)
        with open(path, "rb") as source:

            def body() -> _CountingProducer:
                source.seek(0)
                return _CountingProducer(
                    source,
                    self._cooperator,
                    lambda sent: progress.update(blob.digest, blob.size, sent),
                    progress.moved,
                )

            await self._client.upload_blob(repo, blob.digest, body)


class _CountingProducer(FileBodyProducer):
    """A file body that reports how many bytes it has sent."""

    def __init__(
        self,
        source: BinaryIO,
        cooperator: Cooperator,
        sent: Callable[[int], None],
        moved: Callable[[int], None],
    ):
        super().__init__(source, cooperator=cooperator)
        self._sent = sent
        self._moved = moved

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        return super().startProducing(_Counting(consumer, self._sent, self._moved))


@implementer(IConsumer)
class _Counting:
    def __init__(
        self, consumer: IConsumer, sent: Callable[[int], None], moved: Callable[[int], None]
    ) -> None:
        self._consumer = consumer
        self._report = sent
        self._moved = moved
        self._count = 0

    def write(self, data: bytes) -> None:
        self._consumer.write(data)
        self._moved(len(data))
        self._count += len(data)
        self._report(self._count)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self._consumer.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        self._consumer.unregisterProducer()
