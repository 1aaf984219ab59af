"""The model store: blobs, manifests (blobs too) and an index of tags in ``$MRUNNER_HOME/models``.

The index (``index.json``: manifest digest → tags) is the only mutable file;
it is rewritten atomically and owned by the reactor thread. Threads only copy,
hash and read file contents (an upload is hashed as it arrives, see
L{Upload}); everything that decides what the store holds runs on the
reactor, so a delete never races an import or a pull.

A model is checked before each load (L{ModelStore.ready}, with L{Integrity}):
its blobs' sizes every time, their digests the first time since the daemon
started. A blob that fails is quarantined, and the model then says so
(L{Model.problem}) until it is pulled or imported again.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorThreads, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from zope.interface import implementer

from mrunner.errors import BadRequest, Conflict, MrunnerError, NotFound
from mrunner.interfaces import IModelStore
from mrunner.store.artifact import (
    MODEL_CONFIG,
    Descriptor,
    InvalidManifest,
    Manifest,
    model_config,
    parse_config,
    parse_manifest,
)
from mrunner.store.blobs import Blobs, fsync_dir
from mrunner.store.integrity import Integrity
from mrunner.store.model import Model
from mrunner.store.names import DIGEST, SHORT_ID, Reference, parse
from mrunner.store.upload import Staged, Upload

DEFAULT_PARTIAL_AGE = 7 * 24 * 3600.0

Index = dict[str, list[str]]  # manifest digest -> tags; ``list`` is a method name in the class
Deletion = list[dict[str, str]]
NEAR = 0.8  # how alike a missing name and a stored tag must be to suggest it (difflib's ratio)
Reports = list[dict[str, Any]]
Digests = list[str]


class IStoreReactor(IReactorTime, IReactorThreads):
    """The store reads the time (model creation) and copies big files in the reactor's threads."""


class StoreCorrupt(MrunnerError):
    """A stored manifest or config cannot be read; the message names the model."""

    code = "store_corrupt"


class ModelCorrupt(Conflict):
    """A model whose blob is missing or failed its check: it must be pulled or imported again."""

    code = "model_corrupt"


def shard_name(number: int, count: int) -> str:
    """The name llama.cpp gives shard C{number} (from 1) of C{count}, and looks for beside the first."""
    return f"model-{number:05d}-of-{count:05d}.gguf"


@attrs.frozen
class _Stored:
    """A stored model's parsed manifest and config, and the paths of its files."""

    manifest: Manifest
    config: dict[str, Any]
    created: int
    gguf: str
    shards: tuple[str, ...]
    files: dict[str, str]


@implementer(IModelStore)
class ModelStore:
    """Models on disk in Docker Model Runner's OCI layout, found by their normalised names."""

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
        self._index_path = self.root / "index.json"
        for temp in self.root.glob("index.*.tmp"):  # a crash between write and rename
            temp.unlink()
        self._bundles = self.root / "bundles"
        self._models: Index = self._read_index()
        self._tags = self._tag_map()
        self._artifacts: dict[str, _Stored] = {}
        self._pins: Counter[str] = Counter()
        self.integrity = Integrity(self.blobs, self.in_thread)
        self._remove_stale_bundles()

    # IModelStore

    def resolve(self, name: str) -> Model:
        return self._model(self.lookup(name))

    def list(self) -> list[Model]:
        return [self._model(digest) for digest in self._models]

    def import_gguf(
        self,
        name: str,
        source: BinaryIO,
        licenses: Sequence[bytes] = (),
        context_size: int | None = None,
    ) -> Deferred[Model]:
        upload = self.upload(packaged=False)
        for text in licenses:
            upload.license(text)
        return self._import_file(name, upload, source, context_size)

    def import_package(self, name: str, source: BinaryIO, context_size: int | None = None) -> Deferred[Model]:
        """Store the package tar read from C{source} (see L{mrunner.store.package}), read in a thread."""
        return self._import_file(name, self.upload(packaged=True), source, context_size)

    def upload(self, packaged: bool) -> Upload:
        """Where a GGUF file or (C{packaged}) a package tar is written as it arrives, for L{import_upload}."""
        return Upload(self.blobs, packaged)

    def import_upload(self, name: str, upload: Upload, context_size: int | None = None) -> Deferred[Model]:
        """Store as C{name} the model whose bytes were all written to C{upload}, without reading them again.

        The store takes the staged files over: it commits them, or removes them when the import fails.
        """
        return self._import(name, upload, upload.staged, context_size)

    def disk_usage(self) -> int:
        return self.blobs.usage() + (self._index_path.stat().st_size if self._index_path.exists() else 0)

    def partials_usage(self) -> int:
        return self.blobs.partials_usage()

    def ready(self, name: str) -> Deferred[Model]:
        model = self.resolve(name)
        if model.problem is None and all(self.integrity.known_good(b) for b in self.manifest(model.id).blobs):
            self._link_shards(model.id)
            return succeed(model)  # every request but the first: a stat per blob, no hashing
        return Deferred.fromCoroutine(self._ready(model))

    # Integrity

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

    def verify(self, name: str | None = None) -> Deferred[Reports]:
        """Hash every blob of the model C{name} (of every model, without one) and report.

        @return: per model C{{"id", "tags", "status": "ok"|"corrupt", "problem"?, "blobs": [...]}}.
        """
        digests = [self.lookup(name)] if name is not None else list(self._models)
        return Deferred.fromCoroutine(self._verify(digests))

    async def _verify(self, digests: Digests) -> Reports:
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
            if digest not in self._models:  # deleted while its blobs were hashed
                continue
            model = self._model(digest)
            report = {"id": digest, "tags": list(model.tags), "blobs": blobs}
            report |= {"status": "corrupt", "problem": model.problem} if model.problem else {"status": "ok"}
            reports.append(report)
        return reports

    def remove_old_partials(self) -> None:
        """Remove partial downloads nobody resumed for C{partial_max_age} seconds."""
        self.blobs.remove_partials(self._partial_max_age, self.reactor.seconds())

    # Names

    def lookup(self, name: str) -> str:
        """The manifest digest of the model C{name} (a tag, a digest, or a short id)."""
        if isinstance(name, str) and DIGEST.fullmatch(name):
            return self._known(name, name)
        if isinstance(name, str) and SHORT_ID.fullmatch(name):
            matches = [d for d in self._models if d.removeprefix("sha256:").startswith(name)]
            if len(matches) > 1:
                raise BadRequest(f"model id {name} is ambiguous: give more digits")
            if matches:
                return matches[0]
        ref = parse(name)
        if ref.digest:
            return self._known(ref.digest, name)
        return self._known(self._tags.get(str(ref), ""), str(ref))

    def _known(self, digest: str, name: str) -> str:
        if digest not in self._models:
            raise NotFound(
                f"model {name} not found locally{self._nearest(name)}; pull it first (POST /models/create)",
                code="model_not_found",
            )
        return digest

    def _nearest(self, name: str) -> str:
        """C{" (did you mean TAG?)"} for the stored tag closest to a mistyped C{name}, else nothing."""
        tags = [tag for tags in self._models.values() for tag in tags]
        close = difflib.get_close_matches(name, tags, n=1, cutoff=NEAR)
        return f" (did you mean {close[0]}?)" if close else ""

    # Changes

    def add(self, ref: Reference | None, manifest: bytes) -> Model:
        """Record the model whose blobs are all present, tagged C{ref} when it has a tag."""
        parsed = parse_manifest(manifest)
        missing = [b.digest for b in parsed.blobs if not self.blobs.has(b.digest)]
        if missing:
            raise StoreCorrupt(f"cannot add a model whose blobs are missing: {missing}")
        digest = self.blobs.put(manifest)
        self._retag(digest, ref.tag and str(ref) if ref else None)
        self._link_shards(digest)
        self.log.info("stored model {digest} as {ref}", digest=digest, ref=ref)
        return self._model(digest)

    def tag(self, source: str, target: str) -> Model:
        """Give the model C{source} the name C{target} (moving that tag if it was elsewhere)."""
        digest = self.lookup(source)
        ref = parse(target, "target")
        if ref.digest:
            raise BadRequest(f"cannot tag with a digest reference {target!r}: give a tag")
        self._retag(digest, str(ref))
        return self._model(digest)

    def delete(self, name: str, force: bool = False) -> Deletion:
        """Remove the name C{name}, as C{docker rmi} does: only that tag while another name holds the
        model, else the model and the blobs nothing else uses.

        @raise Conflict: C{name} is the id of a model with several tags and C{force} is false.
        @return: Docker's shape: C{[{"Untagged": tag}, ..., {"Deleted": digest}]}.
        """
        digest, whole = self.deletion(name, force)
        if not whole:
            tag = str(parse(name))
            self._save({d: [t for t in tags if t != tag] for d, tags in self._models.items()})
            self.log.info("untagged {tag} of model {digest}", tag=tag, digest=digest)
            return [{"Untagged": tag}]
        tags = self._models[digest]
        models = dict(self._models)
        del models[digest]
        self._save(models)
        self.collect()
        self.log.info("deleted model {digest} ({tags})", digest=digest, tags=tags)
        return [{"Untagged": tag} for tag in tags] + [{"Deleted": digest}]

    def deletion(self, name: str, force: bool = False) -> tuple[str, bool]:
        """The digest L{delete} would act on, and whether it would remove the whole model; or why it
        would refuse."""
        digest = self.lookup(name)
        tags = self._models[digest]
        if len(tags) < 2:
            return digest, True
        if self._is_tag(name) and str(parse(name)) in tags:
            return digest, False
        if not force:
            raise Conflict(
                f"model {name} is tagged {', '.join(tags)}; remove one of those names, or delete with"
                " force=true to remove all of them",
                code="model_has_several_tags",
            )
        return digest, True

    @staticmethod
    def _is_tag(name: str) -> bool:
        """Whether C{name} is a tag, not a digest or a short id."""
        if DIGEST.fullmatch(name) or SHORT_ID.fullmatch(name):
            return False
        return not parse(name).digest

    @contextmanager
    def pinned(self, digests: Iterable[str]) -> Iterator[None]:
        """Keep blobs that no manifest names yet (a pull in progress) from being collected."""
        held = list(digests)
        self._pins.update(held)
        try:
            yield
        finally:
            self._pins.subtract(held)
            self._pins += Counter()  # drop zero counts

    def manifest(self, digest: str) -> Manifest:
        return self._artifact(digest).manifest

    def manifest_bytes(self, digest: str) -> bytes:
        return self.blobs.read(self._known(digest, digest))

    def in_thread(self, f: Any, *args: Any) -> Deferred[Any]:
        """Run blocking file work (copying, hashing) in the reactor's thread pool."""
        return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), f, *args)

    # Internals

    def _import_file(
        self, name: str, upload: Upload, source: BinaryIO, context_size: int | None
    ) -> Deferred[Model]:
        def stage() -> Staged:
            upload.copy(source)
            return upload.staged()

        return self._import(name, upload, stage, context_size)

    def _import(
        self, name: str, upload: Upload, stage: Callable[[], Staged], context_size: int | None
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
        self, name: str, upload: Upload, stage: Callable[[], Staged], context_size: int | None
    ) -> Model:
        try:
            ref = parse(name)
            if ref.digest:
                raise BadRequest(f"import needs a name with a tag, not a digest: {name!r}")
            info, writers = await self.in_thread(stage)
            # committed together, on the reactor: no collection runs in between
            layers = [
                Descriptor(media_type, writer.commit(), writer.offset) for media_type, writer in writers
            ]
        finally:
            upload.discard()  # the temps, now renamed or useless
        described = info.config()
        if context_size is not None:
            described["context_size"] = context_size
        config = model_config(described, self.reactor.seconds(), layers)
        self.blobs.put(config)
        manifest = Manifest(Descriptor.of(MODEL_CONFIG, config), tuple(layers))
        return self.add(ref, manifest.to_bytes())

    def _retag(self, digest: str, tag: str | None) -> None:
        models = {d: [t for t in tags if t != tag] for d, tags in self._models.items()}
        models.setdefault(digest, [])
        if tag:
            models[digest].append(tag)
        self._save(models)

    def collect(self) -> None:
        """Delete blobs no stored manifest refers to and no pull holds (a refused pull's files)."""
        used = set(self._pins)
        for digest in self._models:
            used.add(digest)
            try:
                used.update(blob.digest for blob in self.manifest(digest).blobs)
            except StoreCorrupt:  # which blobs it names is unknown: keep them all
                return
        for digest in list(self.blobs.digests()):
            if digest not in used:
                self.blobs.remove(digest)
                self._artifacts.pop(digest, None)
        self._remove_stale_bundles()

    # Shards

    def _bundle(self, digest: str) -> Path:
        return self._bundles / digest.removeprefix("sha256:")

    def _link_shards(self, digest: str) -> None:
        """Give a split model's shards the names llama.cpp expects, in a directory of its own.

        llama-server is handed the first shard and opens the others by names it
        derives from the first one's; the blobs are named by digest, so the
        directory holds symbolic links to them (never copies). It is made in a
        temp directory and renamed, so a load never sees half of it.
        """
        shards = self.manifest(digest).shards
        if len(shards) == 1:
            return
        directory = self._bundle(digest)
        links = {
            directory / shard_name(n, len(shards)): os.path.abspath(self.blobs.path(shard.digest))
            for n, shard in enumerate(shards, 1)
        }
        if all(os.path.islink(link) and os.readlink(link) == target for link, target in links.items()):
            return
        temp = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}.tmp")
        temp.mkdir(parents=True)
        for link, target in links.items():
            os.symlink(target, temp / link.name)
        shutil.rmtree(directory, ignore_errors=True)
        os.rename(temp, directory)

    def _remove_stale_bundles(self) -> None:
        """Remove shard directories of models no longer stored, and temps a crash left."""
        if not self._bundles.is_dir():
            return
        for entry in os.scandir(self._bundles):
            if entry.name.endswith(".tmp") or f"sha256:{entry.name}" not in self._models:
                shutil.rmtree(entry.path, ignore_errors=True)

    def _model(self, digest: str) -> Model:
        tags = tuple(self._models[digest])
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
            gguf = shards[0] if len(shards) == 1 else str(self._bundle(digest) / shard_name(1, len(shards)))
            files = {role: self.blobs.file(d) for role, d in manifest.files().items()}
            self._artifacts[digest] = _Stored(manifest, config, created, gguf, shards, files)
        return self._artifacts[digest]

    def _tag_map(self) -> dict[str, str]:
        return {tag: digest for digest, tags in self._models.items() for tag in tags}

    def _read_index(self) -> Index:
        try:
            value = json.loads(self._index_path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError:
            raise StoreCorrupt(f"{self._index_path} is not valid JSON") from None
        models = value.get("models") if isinstance(value, dict) else None
        if not isinstance(models, dict):
            raise StoreCorrupt(f"{self._index_path} is not a model index")
        return {str(d): [str(t) for t in tags] for d, tags in models.items()}

    def _save(self, models: Index) -> None:
        temp = self._index_path.with_name(f"index.{uuid.uuid4().hex}.tmp")
        with open(temp, "wb") as f:
            f.write(json.dumps({"version": 1, "models": models}, indent=1).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, self._index_path)
        fsync_dir(self.root)
        self._models = models
        self._tags = self._tag_map()
