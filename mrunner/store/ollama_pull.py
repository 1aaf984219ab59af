"""Pull a model from Ollama's registry (``ollama.com/[namespace/]name[:tag]``) into the store.

Ollama's registry speaks the distribution API, its manifests Docker's schema 2
with Ollama's media types. Their layers are taken as an import of Ollama's own
store takes them (L{ollama.choose}): the model, a projector and licenses, each
fetched, resumed and verified as every registry blob is (the registry's host,
mirrors and credentials are C{[registry] ollama}'s). The template and params are
not fetched: llama-server runs no Go template, the GGUF's own is used. The
model stored is the one ``mrunner import ollama:NAME`` makes of the same files.

Ollama's manifests carry no date: the config is dated when the name first
held these layers, so pulling an unchanged model again yields the same model
and moves no bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from twisted.logger import Logger

from mrunner.errors import BadRequest, NotFound
from mrunner.interfaces import IProgress
from mrunner.store import fetched, gguf_meta
from mrunner.store.artifact import MAX_SIZES, Descriptor, InvalidManifest, layered
from mrunner.store.local import ModelStore
from mrunner.store.registry import Repository, registry_error
from mrunner.store.sources import ollama
from mrunner.store.sources.found import Refused
from mrunner.values.model import Model, Reference

#: The registry puller's manifest (from a mirror, else the registry) and its fetch of one blob.
FindManifest = Callable[[Reference], Awaitable[tuple[Repository, bytes]]]
FetchFrom = Callable[[Repository, Descriptor, IProgress], Awaitable[None]]


class OllamaPuller:
    """Pulls ``ollama.com/...`` models through the registry puller's manifest and C{fetch}."""

    log = Logger()

    def __init__(self, store: ModelStore, manifest: FindManifest, fetch: FetchFrom) -> None:
        self._store = store
        self._manifest = manifest
        self._fetch = fetch

    async def pull(self, ref: Reference, progress: IProgress) -> Model:
        if ref.repository.count("/") != 1:
            raise BadRequest(
                f"{ref} is not an Ollama model name: use ollama.com/[namespace/]name[:tag]",
                code="invalid_ollama_name",
            )
        repo, data = await self._manifest(ref)
        chosen = _chosen(ref, repo.host, data)
        layers = _layers(ref, repo.host, chosen)
        progress.total = sum(layer.size for layer in layers)
        with fetched.holding(self._store, layers):
            for layer in layers:
                await self._fetch(repo, layer, progress)
            model, info = await fetched.add(self._store, ref, layers, self._created(ref, layers))
        metadata = info.metadata if isinstance(info, gguf_meta.GGUFInfo) else {}
        self.log.info(
            "pulled {ref} from {host} as {id}. {notes}",
            ref=ref,
            host=repo.host,
            id=model.id,
            notes=". ".join(ollama.template_notes(chosen.notes, metadata)),
        )
        return model

    def _created(self, ref: Reference, layers: Sequence[Descriptor]) -> int:
        """When C{ref} came to hold these layers, if it does; else now (whole seconds, as it is kept)."""
        now = int(self._store.reactor.seconds())
        try:
            model = self._store.resolve(str(ref))
        except NotFound:
            return now
        return model.created if self._store.manifest(model.id).layers == tuple(layers) else now


def _chosen(ref: Reference, host: str, data: bytes) -> ollama.Chosen:
    """The layers mrunner takes of the manifest C{data}; @raise BadGateway: not an Ollama model's."""
    try:
        return ollama.choose(ollama.manifest_layers(data, "the manifest"))
    except Refused as e:
        raise registry_error(f"{ref} from {host} is not a model mrunner can serve: {e.message}") from None


def _layers(ref: Reference, host: str, chosen: ollama.Chosen) -> list[Descriptor]:
    """The store's layers of C{chosen}; @raise BadGateway: a layer is no blob, or a license is huge."""
    files: list[tuple[str, dict[str, Any]]] = layered((chosen.model,), chosen.licenses, chosen.projector)
    try:
        layers = [Descriptor(kind, *_blob(layer)) for kind, layer in files]
    except InvalidManifest as e:
        raise registry_error(f"{ref} from {host} is not a usable model: {e}") from None
    for layer in layers:
        if layer.size > MAX_SIZES.get(layer.media_type, layer.size):
            raise registry_error(
                f"{ref} from {host} announces a license of {layer.size} bytes; at most"
                f" {MAX_SIZES[layer.media_type]} are accepted"
            )
    return layers


def _blob(layer: dict[str, Any]) -> tuple[str, int]:
    """The digest and size of a manifest's layer, checked as every manifest's are."""
    blob = Descriptor.from_json(layer)
    return blob.digest, blob.size
