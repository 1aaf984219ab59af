"""The model store: blobs, manifests (blobs too) and an index of tags in ``$MRUNNER_HOME/models``.

The index (``index.json``: manifest digest → tags) is the only mutable file;
it is rewritten atomically and owned by the reactor thread. Threads only copy
and hash file contents; everything that decides what the store holds runs
on the reactor, so a delete never races an import or a pull.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorThreads, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from zope.interface import implementer

from mrunner.errors import BadRequest, Conflict, MrunnerError, NotFound
from mrunner.interfaces import IModelStore
from mrunner.store import gguf_meta
from mrunner.store.artifact import (
    GGUF,
    LICENSE,
    MODEL_CONFIG,
    Descriptor,
    InvalidManifest,
    Manifest,
    model_config,
    parse_config,
    parse_manifest,
)
from mrunner.store.blobs import Blobs, BlobWriter
from mrunner.store.model import Model
from mrunner.store.names import DIGEST, SHORT_ID, Reference, parse

Index = dict[str, list[str]]  # manifest digest -> tags; ``list`` is a method name in the class
Deletion = list[dict[str, str]]


class IStoreReactor(IReactorTime, IReactorThreads):
    """The store reads the time (model creation) and copies big files in the reactor's threads."""


class StoreCorrupt(MrunnerError):
    """A stored manifest or config cannot be read; the message names the model."""

    code = "store_corrupt"


@implementer(IModelStore)
class ModelStore:
    """Models on disk in Docker Model Runner's OCI layout, found by their normalised names."""

    log = Logger()

    def __init__(self, home: Path, reactor: IStoreReactor) -> None:
        self.root = Path(home) / "models"
        self.blobs = Blobs(self.root / "blobs" / "sha256")
        self.blobs.remove_staged()
        self._reactor = reactor
        self._index_path = self.root / "index.json"
        self._models: Index = self._read_index()
        self._tags = self._tag_map()
        self._artifacts: dict[str, tuple[Manifest, dict[str, Any], int]] = {}
        self._pins: Counter[str] = Counter()

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
        return Deferred.fromCoroutine(self._import(name, source, licenses, context_size))

    def disk_usage(self) -> int:
        return self.blobs.usage() + (self._index_path.stat().st_size if self._index_path.exists() else 0)

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
                f"model {name} not found locally; pull it first (POST /models/create)",
                code="model_not_found",
            )
        return digest

    # Changes

    def add(self, ref: Reference | None, manifest: bytes) -> Model:
        """Record the model whose blobs are all present, tagged C{ref} when it has a tag."""
        parsed = parse_manifest(manifest)
        missing = [b.digest for b in parsed.blobs if not self.blobs.has(b.digest)]
        if missing:
            raise StoreCorrupt(f"cannot add a model whose blobs are missing: {missing}")
        digest = self.blobs.put(manifest)
        self._retag(digest, ref.tag and str(ref) if ref else None)
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

    def untag(self, name: str) -> Model:
        """Remove the tag C{name} only: the model stays, under its other names (Ollama's delete of a copy)."""
        digest = self.lookup(name)
        tag = str(parse(name))
        if tag not in self._models[digest]:
            raise BadRequest(f"{name} is not one of the model's tags: {', '.join(self._models[digest])}")
        self._save({d: [t for t in tags if t != tag] for d, tags in self._models.items()})
        return self._model(digest)

    def delete(self, name: str, force: bool = False) -> Deletion:
        """Remove the model C{name} and the blobs nothing else uses.

        @raise Conflict: the model has several tags and C{force} is false.
        @return: Docker's shape: C{[{"Untagged": tag}, ..., {"Deleted": digest}]}.
        """
        digest = self.deletable(name, force)
        tags = self._models[digest]
        models = dict(self._models)
        del models[digest]
        self._save(models)
        self._collect()
        self.log.info("deleted model {digest} ({tags})", digest=digest, tags=tags)
        return [{"Untagged": tag} for tag in tags] + [{"Deleted": digest}]

    def deletable(self, name: str, force: bool = False) -> str:
        """The digest L{delete} would remove, or why it would refuse."""
        digest = self.lookup(name)
        tags = self._models[digest]
        if len(tags) > 1 and not force:
            raise Conflict(
                f"model {name} is tagged {', '.join(tags)}; delete with force=true to remove all of them",
                code="model_has_several_tags",
            )
        return digest

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
        return self._artifact(digest)[0]

    def manifest_bytes(self, digest: str) -> bytes:
        return self.blobs.read(self._known(digest, digest))

    def in_thread(self, f: Any, *args: Any) -> Deferred[Any]:
        """Run blocking file work (copying, hashing) in the reactor's thread pool."""
        return deferToThreadPool(self._reactor, self._reactor.getThreadPool(), f, *args)

    # Internals

    async def _import(
        self, name: str, source: BinaryIO, licenses: Sequence[bytes], context_size: int | None
    ) -> Model:
        ref = parse(name)
        if ref.digest:
            raise BadRequest(f"import needs a name with a tag, not a digest: {name!r}")
        writer = self.blobs.writer(None)
        try:
            info = await self.in_thread(_stage, writer, source)
            weights = Descriptor(GGUF, writer.commit(), info.size)
        except BaseException:
            writer.discard()
            raise
        layers = [weights]
        for text in licenses:
            self.blobs.put(text)
            layers.append(Descriptor.of(LICENSE, text))
        described = info.config()
        if context_size is not None:
            described["context_size"] = context_size
        config = model_config(described, self._reactor.seconds(), layers)
        self.blobs.put(config)
        manifest = Manifest(Descriptor.of(MODEL_CONFIG, config), tuple(layers))
        return self.add(ref, manifest.to_bytes())

    def _retag(self, digest: str, tag: str | None) -> None:
        models = {d: [t for t in tags if t != tag] for d, tags in self._models.items()}
        models.setdefault(digest, [])
        if tag:
            models[digest].append(tag)
        self._save(models)

    def _collect(self) -> None:
        """Delete blobs no stored manifest refers to and no pull holds."""
        used = set(self._pins)
        for digest in self._models:
            used.add(digest)
            used.update(blob.digest for blob in self.manifest(digest).blobs)
        for digest in list(self.blobs.digests()):
            if digest not in used:
                self.blobs.remove(digest)
                self._artifacts.pop(digest, None)

    def _model(self, digest: str) -> Model:
        manifest, config, created = self._artifact(digest)
        return Model(
            id=digest,
            tags=tuple(self._models[digest]),
            created=created,
            config=config,
            gguf=str(self.blobs.path(manifest.gguf.digest)),
            files={role: str(self.blobs.path(d)) for role, d in manifest.files().items()},
        )

    def _artifact(self, digest: str) -> tuple[Manifest, dict[str, Any], int]:
        """The parsed manifest and config of a stored model (immutable, so cached)."""
        if digest not in self._artifacts:
            try:
                manifest = parse_manifest(self.blobs.read(digest))
                config, created = parse_config(self.blobs.read(manifest.config.digest))
            except (OSError, InvalidManifest) as e:
                raise StoreCorrupt(f"model {digest} cannot be read: {e}") from None
            self._artifacts[digest] = (manifest, config, created)
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
        self._models = models
        self._tags = self._tag_map()


def _stage(writer: BlobWriter, source: BinaryIO) -> gguf_meta.GGUFInfo:
    """Copy and hash C{source} into the temp, then read its GGUF header (in a thread)."""
    writer.copy(source)
    writer.seal()
    return gguf_meta.read(writer.temp)
