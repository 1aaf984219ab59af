"""A model made of blobs a pull fetched from a source that publishes files, not models (the Hub,
Ollama's registry): its header read from the store's files, its config written, its manifest added.

A file whose sha256 is good but which is not GGUF weights (or a Whisper model)
is a refusal, not a fault: L{holding} removes what the pull fetched, unless
another model uses it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from mrunner.errors import BadRequest
from mrunner.store import gguf_meta, whisper_meta
from mrunner.store.artifact import MMPROJ, MODEL_CONFIG, WEIGHTS, WHISPER, Descriptor, Manifest, model_config
from mrunner.store.local import ModelStore
from mrunner.values.model import Model, Reference

Info = gguf_meta.GGUFInfo | whisper_meta.WhisperInfo


class NotGGUF(BadRequest):
    """A file a source published (its sha256 good) is not weights a model can use."""


@contextmanager
def holding(store: ModelStore, layers: Sequence[Descriptor]) -> Iterator[None]:
    """Keep C{layers} from collection while a pull fetches them; if their model is refused, they go."""
    try:
        with store.keeping(layer.digest for layer in layers):
            yield
    except NotGGUF:
        store.collect()
        raise


async def add(
    store: ModelStore, name: Reference, layers: Sequence[Descriptor], created: float
) -> tuple[Model, Info]:
    """Store as C{name} the model of C{layers}, all in the store; with what its weights' header says.

    @raise NotGGUF: a file is not a GGUF file (or the first a Whisper model), or not one model's.
    """
    info = await describe(store, layers)
    config = model_config(info.config(), created, layers)
    store.blobs.put(config)
    manifest = Manifest(Descriptor.of(MODEL_CONFIG, config), tuple(layers))
    return store.add(name, manifest.to_bytes()), info


async def describe(store: ModelStore, layers: Sequence[Descriptor]) -> Info:
    """The weights' header, read from the store's files (a projector, last, checked to be one)."""
    paths = [store.blobs.path(layer.digest) for layer in layers if layer.media_type in (*WEIGHTS, MMPROJ)]
    try:
        if layers[0].media_type == WHISPER:
            return await store.in_thread(whisper_meta.read, paths[0])
        headers = await store.in_thread(gguf_meta.read_all, paths)
        return gguf_meta.of_model(headers, any(layer.media_type == MMPROJ for layer in layers))
    except BadRequest as e:
        raise NotGGUF(e.message, code=e.code) from None
