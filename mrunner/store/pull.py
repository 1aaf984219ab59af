"""Pull a model from a registry into the store, blob by blob, resuming what was cut.

A blob streams into ``<hex>.incomplete`` and is hashed as it arrives; only a
verified blob is renamed into place. A cut connection is resumed with HTTP
Range (within this pull, and by the next pull if this one gives up), a blob
the store already has is not fetched (but hashed, once per daemon start: a
corrupt one is quarantined and fetched again; a size that disagrees with a good
one is the remote's error, and refuses the pull), small blobs announced as large
are refused before any download, and at most C{max_pulls} pulls run at once
while the others wait their turn.

A download that receives nothing for C{read_timeout} seconds (before its
headers, or mid-body) is cut and resumed as a cut connection is, and named by
its host when it fails for good: a stalled server never holds a pull for ever.
A store that cannot write (a full disk) ends the pull with an error that says
how much the blob still needs; what was downloaded is kept for the next pull.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred, DeferredSemaphore
from twisted.logger import Logger
from twisted.web.client import ResponseFailed
from zope.interface import implementer

from mrunner.errors import BadRequest, MrunnerError, NotFound
from mrunner.interfaces import IModelPuller, IProgress
from mrunner.names import OLLAMA_HOSTS
from mrunner.store.artifact import MAX_SIZES, Descriptor, InvalidManifest, parse_manifest, sha256
from mrunner.store.blobs import BlobWriter, DigestMismatch
from mrunner.store.hub_pull import HubPuller, Open
from mrunner.store.huggingface import HubClient, is_hub
from mrunner.store.integrity import SizeDisagrees
from mrunner.store.local import ModelStore
from mrunner.store.locks import KeyedLocks
from mrunner.store.ollama_pull import OllamaPuller
from mrunner.store.registry import RegistryClient, Repository, registry_error
from mrunner.store.stall import READ_TIMEOUT, Stalled, Timeout, collect
from mrunner.store.upload import StoreWriteFailed
from mrunner.values.model import Model, Reference
from mrunner.values.sizes import format_size

#: A registry's, the Hub's or Ollama's registry's pull of one model.
PullOne = Callable[[Reference, IProgress], Coroutine[Any, Any, Model]]


@implementer(IModelPuller)
class Puller:
    """Pulls models; one instance per daemon, so the pull limit and per-blob locks are shared."""

    log = Logger()

    def __init__(
        self,
        store: ModelStore,
        client: RegistryClient,
        max_pulls: int = 2,
        attempts: int = 3,
        hub: HubClient | None = None,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self._store = store
        self._client = client
        self._timeout = Timeout(store.reactor, read_timeout)
        self._slots = DeferredSemaphore(max_pulls)
        self._attempts = attempts
        self._fetching = KeyedLocks()
        self._hub = HubPuller(store, hub, self.fetch) if hub else None
        self._ollama = OllamaPuller(store, self._manifest, self._fetch)

    def pull(self, ref: Reference, progress: IProgress) -> Deferred[Model]:
        """Fetch C{ref} (from a registry, from Hugging Face for ``hf.co/...``, from Ollama's registry for
        ``ollama.com/...``) and store it under its tag; waits while C{max_pulls} others run."""
        pull = self._puller(ref)
        return self._slots.run(lambda: Deferred.fromCoroutine(self._writing(pull, ref, progress)))

    def _puller(self, ref: Reference) -> PullOne:
        if is_hub(ref):
            if self._hub is None:
                raise BadRequest(f"{ref}: this daemon has no Hugging Face client configured")
            return self._hub.pull
        return self._ollama.pull if ref.registry in OLLAMA_HOSTS else self._pull

    async def _writing(self, pull: PullOne, ref: Reference, progress: IProgress) -> Model:
        """C{pull}, with the store's failed writes (a manifest, the index) said as such, not as a crash."""
        try:
            return await pull(ref, progress)
        except OSError as e:
            raise self._write_failed(f"{ref}", e) from None

    async def _pull(self, ref: Reference, progress: IProgress) -> Model:
        self._store.remove_old_partials()
        repo, data = await self._manifest(ref)
        try:
            manifest = parse_manifest(data)
        except InvalidManifest as e:
            raise registry_error(f"{ref} from {repo.host} is not a usable model: {e}") from None
        big = manifest.oversized()
        if big is not None:
            raise registry_error(
                f"{ref} from {repo.host} announces a {manifest.role(big.digest)} of {big.size} bytes"
                f" ({big.media_type}); at most {MAX_SIZES[big.media_type]} are accepted"
            )
        progress.total = sum(blob.size for blob in manifest.blobs)
        with self._store.keeping(blob.digest for blob in manifest.blobs):
            for blob in manifest.blobs:
                await self._fetch(repo, blob, progress)
            model = self._store.add(ref, data)
        self.log.info("pulled {ref} from {host} as {id}", ref=ref, host=repo.host, id=model.id)
        return model

    async def _manifest(self, ref: Reference) -> tuple[Repository, bytes]:
        """The manifest from the mirror if it has it, else from the registry itself."""
        *mirrors, origin = self._client.repositories(ref)
        for mirror in mirrors:
            try:
                return mirror, await self._manifest_from(mirror, ref)
            except MrunnerError as e:
                self.log.warn("mirror {host} failed: {error}", host=mirror.host, error=e.message)
        try:
            return origin, await self._manifest_from(origin, ref)
        except NotFound:
            raise NotFound(
                f"model {ref} not found in registry {origin.host}", code="model_not_found"
            ) from None

    async def _manifest_from(self, repo: Repository, ref: Reference) -> bytes:
        data = await self._client.manifest(repo, str(ref.digest or ref.tag))
        if ref.digest and sha256(data) != ref.digest:
            raise registry_error(f"{repo.host} sent a manifest that is not {ref.digest}")
        return data

    async def _fetch(self, repo: Repository, blob: Descriptor, progress: IProgress) -> None:
        await self.fetch(blob, progress, repo.host, partial(self._client.blob, repo, blob.digest))

    async def fetch(self, blob: Descriptor, progress: IProgress, host: str, open: Open) -> None:
        """Make sure the store has C{blob}, from C{open(offset)}; one download per digest however
        many pulls want it."""
        async with self._fetching.holding(blob.digest):
            try:
                held = await self._store.integrity.holds(blob)
            except SizeDisagrees as e:
                raise registry_error(f"{host} {e}", code="registry_size_mismatch") from None
            if not held:
                await self._download(blob, progress, host, open)
        progress.update(blob.digest, blob.size, blob.size)

    async def _download(self, blob: Descriptor, progress: IProgress, host: str, open: Open) -> None:
        writer: BlobWriter = await self._store.in_thread(self._store.blobs.writer, blob.digest, True)
        try:
            for attempt in range(1, self._attempts + 1):
                try:
                    await self._stream(blob, writer, progress, host, open)
                    break
                except (ResponseFailed, Stalled) as e:
                    if attempt == self._attempts:
                        raise registry_error(
                            f"download of {blob.digest} from {host} failed {attempt} times"
                            f" (the partial download is kept and resumes next time): {e}"
                        ) from None
                    self.log.warn(
                        "download of {digest} cut at {offset} bytes; resuming",
                        digest=blob.digest,
                        offset=writer.offset,
                    )
            await self._store.in_thread(writer.seal)
            writer.commit()
        except DigestMismatch as e:
            writer.discard()
            raise registry_error(f"{host} sent a corrupt blob {blob.digest}: {e}") from None
        except OSError as e:
            writer.close()
            needed = blob.size - writer.offset
            raise self._write_failed(f"blob {blob.digest}", e, needed, writer.offset) from None
        except BaseException:
            writer.close()
            raise

    def _write_failed(self, what: str, error: OSError, needed: int = 0, kept: int = 0) -> StoreWriteFailed:
        """What a failed write tells the client: for a full disk, how much C{what} still C{needed}."""
        root = self._store.blobs.root
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            return StoreWriteFailed(f"the store cannot write {what} in {root}: {error.strerror}")
        free = format_size(shutil.disk_usage(root).free)
        advice = "free some space (`mrunner df`, `mrunner rm`) and pull again"
        if not needed:
            message = f"{what} could not be written, and {free} are free: {advice}"
        else:
            message = (
                f"{what} needs {format_size(needed)} ({needed} bytes) more, and {free} are free. The"
                f" {format_size(kept)} downloaded are kept: {advice} to resume"
            )
        return StoreWriteFailed(f"the disk of the store ({root}) is full: {message}", code="store_full")

    async def _stream(
        self, blob: Descriptor, writer: BlobWriter, progress: IProgress, host: str, open: Open
    ) -> None:
        response = await open(writer.offset)  # within the client's read timeout
        if response.code == 416:  # our partial is not a prefix the server knows: start over
            writer.restart()
            response = await open(0)
        if response.code == 200 and writer.offset:
            writer.restart()

        def write(data: bytes) -> None:
            if writer.offset + len(data) > blob.size:
                raise DigestMismatch(f"more than the {blob.size} bytes the manifest announced")
            writer.write(data)
            progress.moved(len(data))
            progress.update(blob.digest, blob.size, writer.offset)

        await collect(response, write, host, self._timeout)
        if writer.offset != blob.size:
            raise DigestMismatch(f"{writer.offset} bytes instead of {blob.size}")
