"""Pull a GGUF model, or a whisper.cpp model (L{hub_whisper}), from a Hugging Face repository into
the store as a Docker Model Runner artifact.

The files chosen (L{select}) are blobs named by the sha256 the Hub publishes
for them, fetched, resumed and verified as registry blobs are; the config is
read from the weights' GGUF header (L{fetched}), dated by the repository's last
change, so pulling an unchanged repository again yields the same manifest and
moves no bytes but the listing. A file that is not GGUF weights is refused and
removed from the store (its sha256 is good, but no model may use it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from twisted.logger import Logger
from twisted.web.iweb import IResponse

from mrunner.errors import BadRequest
from mrunner.interfaces import IProgress
from mrunner.store import fetched, hub_whisper
from mrunner.store.artifact import WHISPER, Descriptor, layered
from mrunner.store.huggingface import HubClient, HubFile, Selection, hub_reference, select
from mrunner.store.local import ModelStore
from mrunner.values.model import Model, Reference

#: A blob's body from an offset: 206 when the range was honoured, 200 for all of it, 416 refused.
#: L{Puller.fetch} takes a blob, the progress, the host it comes from and its C{Open}.
Open = Callable[[int], Coroutine[Any, Any, IResponse]]
Fetch = Callable[[Descriptor, IProgress, str, Open], Awaitable[None]]


class HubPuller:
    """Pulls ``hf.co/...`` models; blobs come through the registry puller's C{fetch} (locks, resume)."""

    log = Logger()

    def __init__(self, store: ModelStore, client: HubClient, fetch: Fetch) -> None:
        self._store = store
        self._client = client
        self._fetch = fetch

    async def pull(self, ref: Reference, progress: IProgress) -> Model:
        name = hub_reference(ref)
        repo = ref.repository
        if ref.digest or repo.count("/") > 1:
            raise BadRequest(
                f"{ref} is not a Hugging Face model name: use hf.co/{{org}}/{{repo}}[:{{quant}}]",
                code="invalid_hub_name",
            )
        revision = await self._client.revision(repo)
        has_gguf = any(f.path.lower().endswith(".gguf") for f in revision.files)
        whisper = None if has_gguf else hub_whisper.select(repo, revision.files, ref.tag)
        if whisper is not None:
            chosen = Selection(whisper.name, (whisper,))
            files = [(WHISPER, whisper)]
        else:
            chosen = select(repo, revision.files, ref.tag)
            files = layered(chosen.weights, projector=chosen.mmproj)
        layers = [Descriptor(media_type, _digest(repo, f), f.size) for media_type, f in files]
        progress.total = sum(layer.size for layer in layers)
        with fetched.holding(self._store, layers):
            for layer, (_, f) in zip(layers, files, strict=True):
                await self._fetch(
                    layer, progress, self._client.host, partial(self._client.open, repo, revision, f)
                )
            model, _ = await fetched.add(self._store, name, layers, revision.modified)
        self.log.info(
            "pulled {ref} ({quant}, {files} file(s)) from {host} as {id}",
            ref=name,
            quant=chosen.quant,
            files=len(layers),
            host=self._client.host,
            id=model.id,
        )
        return model


def _digest(repo: str, file: HubFile) -> str:
    if file.sha256 is None:
        raise BadRequest(
            f"hf.co/{repo}: {file.path} is not stored with Git LFS, so the Hub publishes no sha256"
            " to verify it against; mrunner does not pull unverifiable weights",
            code="unverifiable_file",
        )
    return f"sha256:{file.sha256}"
