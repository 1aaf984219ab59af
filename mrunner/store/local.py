"""The model store: blobs, manifests (blobs too) and an index of tags in ``$MRUNNER_HOME/models``.

The index (L{Index}) is the only mutable file; it is owned by the reactor
thread. Threads only copy, hash and read file contents (an import is staged as
it arrives, see L{Imports}); everything that decides what the store holds runs
on the reactor, so a delete never races an import or a pull.

A model is checked before each load (L{ModelStore.ready}, with L{Integrity}):
its blobs' sizes every time, their digests the first time since the daemon
started. A blob that fails is quarantined, and the model then says so
(L{Model.problem}) until it is pulled or imported again.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, cast

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorThreads, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from zope.interface import implementer

from mrunner.errors import BadRequest
from mrunner.interfaces import IModelStoreAdmin, IUpload
from mrunner.names import parse
from mrunner.store.artifact import Descriptor, InvalidManifest, Manifest, parse_config, parse_manifest
from mrunner.store.blobs import Blobs
from mrunner.store.bundles import Bundles
from mrunner.store.errors import ModelCorrupt, StoreCorrupt
from mrunner.store.imports import Imports, Staging
from mrunner.store.index import Index
from mrunner.store.integrity import Integrity
from mrunner.store.registry import MAX_MANIFEST
from mrunner.store.spelling import fewest_tokens
from mrunner.store.upload import Staged, Upload
from mrunner.values.model import Deletion, Model, Reference, Reports

DEFAULT_PARTIAL_AGE = 7 * 24 * 3600.0


class IStoreReactor(IReactorTime, IReactorThreads):
    """The store reads the time (model creation) and copies big files in the reactor's threads."""


@attrs.frozen
class _Stored:
    """A stored model's parsed manifest and config, and the paths of its files."""

    manifest: Manifest
    config: dict[str, Any]
    created: int
    gguf: str
    shards: tuple[str, ...]
    files: dict[str, str]


@implementer(IModelStoreAdmin)
class ModelStore:
    """Models on disk in Docker Model Runner's OCI layout, found by their normalised names.

    It holds the L{Index}, the L{Blobs}, the split models' L{Bundles} and the L{Imports}
    together: a change that touches more than one of them is made here.
    """

    log = Logger()

    def __init__(
        self, home: Path, reactor: IStoreReactor, partial_max_age: float = DEFAULT_PARTIAL_AGE
    ) -> None:
        self.root = Path(home) / "models"
        self.blobs = Blobs(self.root / "blobs" / "sha256", self.root / "quarantine")
        self.blobs.remove_staged()
        self.reactor = reactor
        self._partial_max_age = partial_max_age
        self.remove_old_partials()
        self._index = Index(self.root, self._manifests)
        self._bundles = Bundles(self.root / "bundles")
        self._artifacts: dict[str, _Stored] = {}
        self._kept: Counter[str] = Counter()
        self.integrity = Integrity(self.blobs, self.in_thread)
        self._imports = Imports(self.blobs, reactor, self.in_thread, self.add)
        self._bundles.remove_stale(self._index)

    # IModelStore: reading

    def resolve(self, name: str) -> Model:
        return self._model(self._index.lookup(name))

    def list(self) -> list[Model]:
        return [self._model(digest) for digest in self._index]

    def disk_usage(self) -> int:
        return self.blobs.usage() + self._index.size()

    def partials_usage(self) -> int:
        return self.blobs.partials_usage()

    def ready(self, model: Model) -> Deferred[Model]:
        if model.problem is None and all(self.integrity.known_good(b) for b in self.manifest(model.id).blobs):
            self._link_shards(model.id)
            return succeed(model)  # every request but the first: a stat per blob, no hashing
        return Deferred.fromCoroutine(self._ready(model))

    def fewest_tokens(self, model: Model, texts: Sequence[str], past: int) -> Deferred[int | None]:
        return self.in_thread(fewest_tokens, model.gguf, texts, past)

    async def _ready(self, model: Model) -> Model:
        for blob in () if model.problem else self.manifest(model.id).blobs:
            if not await self.integrity.intact(blob):
                model = self._model(model.id)
                break
        if model.problem:
            raise ModelCorrupt(
                f"model {model.name} cannot be loaded: {model.problem}; pull it again"
                " (or import it again if it was never pulled)"
            )
        self._link_shards(model.id)
        return model

    # IModelStoreAdmin: imports

    def import_gguf(
        self,
        name: str,
        source: BinaryIO,
        licenses: Sequence[bytes] = (),
        context_size: int | None = None,
    ) -> Deferred[Model]:
        return self._imports.gguf(name, source, licenses, context_size)

    def import_package(self, name: str, source: BinaryIO, context_size: int | None = None) -> Deferred[Model]:
        return self._imports.file(name, self.upload(packaged=True), source, context_size)

    def upload(self, packaged: bool) -> Upload:
        return self._imports.upload(packaged)

    def import_upload(self, name: str, upload: IUpload, context_size: int | None = None) -> Deferred[Model]:
        staged = cast(Upload, upload)  # the one IUpload there is: what upload() made
        return self._imports.staged(name, staged, staged.staged, context_size)

    def import_staged(self, name: str, staging: Staging, stage: Callable[[], Staged]) -> Deferred[Model]:
        """Import as C{name} what C{stage} stages in a thread (another tool's files, linked in)."""
        return self._imports.staged(name, staging, stage, None)

    # IModelStoreAdmin: names and removal

    def tag(self, source: str, target: str) -> Model:
        digest = self._index.lookup(source)
        ref = parse(target, "target")
        if ref.digest:
            raise BadRequest(f"cannot tag with a digest reference {target!r}: give a tag")
        self._index.retag(digest, str(ref))
        return self._model(digest)

    def deletion(self, name: str, force: bool = False) -> tuple[str, bool]:
        return self._index.deletion(name, force)

    def delete(self, name: str, force: bool = False) -> Deletion:
        digest, whole = self._index.deletion(name, force)
        if not whole:
            tag = str(parse(name))
            self._index.untag(tag)
            self.log.info("untagged {tag} of model {digest}", tag=tag, digest=digest)
            return [{"Untagged": tag}]
        tags = self._index.remove(digest)
        self.collect()
        self.log.info("deleted model {digest} ({tags})", digest=digest, tags=tags)
        return [{"Untagged": tag} for tag in tags] + [{"Deleted": digest}]

    # IModelStoreAdmin: verification

    def verify(self, name: str | None = None) -> Deferred[Reports]:
        digests = [self._index.lookup(name)] if name is not None else list(self._index)
        return Deferred.fromCoroutine(self._verify(digests))

    async def _verify(self, digests: Sequence[str]) -> Reports:
        reports: Reports = []
        for digest in digests:
            blobs: list[dict[str, Any]] = []
            manifest = Descriptor("manifest", digest, self.blobs.size(digest) or 0)
            try:
                described = (manifest, *self.manifest(digest).blobs)
            except StoreCorrupt:
                described = (manifest,)
            for blob in described:
                status = "ok" if await self.integrity.intact(blob, rehash=True) else "corrupt"
                blobs.append({"digest": blob.digest, "mediaType": blob.media_type, "status": status})
            if digest not in self._index:  # deleted while its blobs were hashed
                continue
            model = self._model(digest)
            report = {"id": digest, "tags": list(model.tags), "blobs": blobs}
            report |= {"status": "corrupt", "problem": model.problem} if model.problem else {"status": "ok"}
            reports.append(report)
        return reports

    # What pulls and pushes use

    def lookup(self, name: str) -> str:
        """The manifest digest of the model C{name} (a tag, a digest, or a short id)."""
        return self._index.lookup(name)

    def manifest(self, digest: str) -> Manifest:
        return self._artifact(digest).manifest

    def manifest_bytes(self, digest: str) -> bytes:
        return self.blobs.read(self._index.known(digest, digest))

    def add(self, ref: Reference | None, manifest: bytes) -> Model:
        """Record the model whose blobs are all present, tagged C{ref} when it has a tag."""
        parsed = parse_manifest(manifest)
        missing = [b.digest for b in parsed.blobs if not self.blobs.has(b.digest)]
        if missing:
            raise StoreCorrupt(f"cannot add a model whose blobs are missing: {missing}")
        digest = self.blobs.put(manifest)
        self._index.retag(digest, ref.tag and str(ref) if ref else None)
        self._link_shards(digest)
        self.log.info("stored model {digest} as {ref}", digest=digest, ref=ref)
        return self._model(digest)

    @contextmanager
    def keeping(self, digests: Iterable[str]) -> Iterator[None]:
        """Keep the blobs C{digests}, which no manifest may name yet (a pull or push in progress), from
        being collected."""
        held = list(digests)
        self._kept.update(held)
        try:
            yield
        finally:
            self._kept.subtract(held)
            self._kept += Counter()  # drop zero counts

    def collect(self) -> None:
        """Delete blobs no stored manifest refers to and no pull holds (a refused pull's files)."""
        used = set(self._kept)
        for digest in self._index:
            used.add(digest)
            try:
                used.update(blob.digest for blob in self.manifest(digest).blobs)
            except StoreCorrupt:  # which blobs it names is unknown: keep them all
                return
        for digest in list(self.blobs.digests()):
            if digest not in used:
                self.blobs.remove(digest)
                self._artifacts.pop(digest, None)
        self._bundles.remove_stale(self._index)

    def remove_old_partials(self) -> None:
        """Remove partial downloads nobody resumed for C{partial_max_age} seconds."""
        self.blobs.remove_partials(self._partial_max_age, self.reactor.seconds())

    def in_thread(self, f: Any, *args: Any) -> Deferred[Any]:
        """Run blocking file work (copying, hashing) in the reactor's thread pool."""
        return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), f, *args)

    # Internals

    def _manifests(self) -> Iterator[str]:
        """The digests of the stored model manifests whose blobs are all there (what the index lists)."""
        for digest in self.blobs.digests():
            if (self.blobs.size(digest) or 0) > MAX_MANIFEST:
                continue  # weights
            try:
                manifest = parse_manifest(self.blobs.read(digest))
            except (OSError, InvalidManifest):
                continue  # a config, a license, a template, or not a model's
            if all(self.blobs.has(blob.digest) for blob in manifest.blobs):
                yield digest

    def _link_shards(self, digest: str) -> None:
        """Give a split model's shards the names llama.cpp expects (L{Bundles})."""
        shards = self.manifest(digest).shards
        if len(shards) > 1:
            self._bundles.link(digest, [os.path.abspath(self.blobs.path(shard.digest)) for shard in shards])

    def _model(self, digest: str) -> Model:
        tags = tuple(self._index.tags(digest))
        try:
            stored = self._artifact(digest)
        except StoreCorrupt as e:
            return Model(id=digest, tags=tags, created=0, config={}, gguf="", problem=e.message)
        return Model(
            id=digest,
            tags=tags,
            created=stored.created,
            config=stored.config,
            gguf=stored.gguf,
            shards=stored.shards,
            files=stored.files,
            problem=self.integrity.problem(digest, stored.manifest),
        )

    def _artifact(self, digest: str) -> _Stored:
        """What a stored model's manifest and config say (immutable, so read once)."""
        if digest not in self._artifacts:
            try:
                manifest = parse_manifest(self.blobs.read(digest))
                config, created = parse_config(self.blobs.read(manifest.config.digest))
            except (OSError, InvalidManifest) as e:
                raise StoreCorrupt(f"the manifest or config of model {digest} cannot be read: {e}") from None
            shards = tuple(self.blobs.file(shard.digest) for shard in manifest.shards)
            gguf = shards[0] if len(shards) == 1 else self._bundles.first(digest, len(shards))
            files = {role: self.blobs.file(d) for role, d in manifest.files().items()}
            self._artifacts[digest] = _Stored(manifest, config, created, gguf, shards, files)
        return self._artifacts[digest]
