"""Every source at once: what ``mrunner ls --found`` lists, and the one model an import names.

The folders are read in a thread (a big cache is many directories); each model's
GGUF header is read once and kept while its file's size and time stay the same.
Which found models the store holds already is decided on the reactor, which
owns the store: by the digest the source names a file by, or by the file itself
(a hard link shares its inode).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from twisted.logger import Logger

from mrunner.config import SourcesConfig
from mrunner.errors import BadRequest, MrunnerError, NotFound
from mrunner.store import gguf_meta
from mrunner.store.local import ModelStore
from mrunner.store.sources import hf_cache, llamacpp, lmstudio, ollama
from mrunner.store.sources.folders import (
    Group,
    found_in,
    gguf_files,
    groups,
    inside,
    lower_keys,
    quant_tag,
    store_name,
)
from mrunner.store.sources.found import Found
from mrunner.store.sources.linking import Linking
from mrunner.values.model import Model

MODULES = {
    ollama.SOURCE: ollama,
    hf_cache.SOURCE: hf_cache,
    lmstudio.SOURCE: lmstudio,
    llamacpp.SOURCE: llamacpp,
}
#: Each source's key in C{[sources]}.
CONFIG_KEYS = {"ollama": "ollama", "hf-cache": "huggingface", "lmstudio": "lmstudio", "llama.cpp": "llamacpp"}
FORMS = (
    "ollama:NAME[:TAG], hf-cache:ORG/REPO[:QUANT], lmstudio:PUBLISHER/REPO[:QUANT], llama.cpp:FILE"
    " or /PATH/TO/FILE.gguf"
)
#: A file's identity for the header cache: its path, size and modification time.
Stamp = tuple[str, int, int]


class Sources:
    """The other tools' folders (C{roots}: source → folder, None when off), and imports from them."""

    log = Logger()

    def __init__(self, roots: Mapping[str, Path | None], store: ModelStore) -> None:
        self.roots = dict(roots)
        self._store = store
        self._headers: dict[Stamp, gguf_meta.GGUFInfo | None] = {}

    @classmethod
    def configured(cls, config: SourcesConfig, environ: Mapping[str, str], store: ModelStore) -> Sources:
        """The folders C{[sources]} names, else where each tool looks (its variables, then its default)."""
        roots = {
            name: module.root(getattr(config, CONFIG_KEYS[name]), environ) for name, module in MODULES.items()
        }
        return cls(roots, store)

    def found(self) -> Iterator[Found]:
        """Every model in every folder that is there (blocking)."""
        for name, module in MODULES.items():
            root = self.roots.get(name)
            if root is not None and root.is_dir():
                yield from module.scan(root)

    async def listing(self) -> list[dict[str, Any]]:
        """The found models as C{GET /models?found=1} shows them, marking those the store holds."""
        described = await self._store.in_thread(lambda: [(f, self._header(f)) for f in self.found()])
        stored = self._stored()
        return [_entry(found, info, stored) for found, info in described]

    def resolve(self, text: str) -> Found:
        """The one model C{text} names (blocking); @raise MrunnerError: none, several, or refused."""
        if text.startswith("/"):
            return _path(Path(text)).check()
        source, colon, rest = text.partition(":")
        if not colon or source not in MODULES:
            raise BadRequest(f"import from {text!r:.100}: give {FORMS}", code="invalid_source")
        root = self.roots.get(source)
        if root is None or not root.is_dir():
            raise NotFound(
                f"no {source} folder here ({root or 'turned off in [sources]'}): set [sources] in tap.conf"
            )
        matches = [found for found in MODULES[source].scan(root) if rest.lower() in found.keys]
        if not matches:
            raise NotFound(f"{source} has no model {rest!r:.100} in {root}: `mrunner ls --found` lists them")
        if len(matches) > 1:
            raise BadRequest(
                f"{text!r:.100} names {len(matches)} models: give one of {[m.ref for m in matches]}"
            )
        return matches[0].check()

    async def import_(self, text: str, name: str | None) -> tuple[Model, dict[str, Any]]:
        """Bring the model C{text} names into the store as C{name} (default: its own), linked in."""
        found = await self._store.in_thread(self.resolve, text)
        linking = Linking(self._store.blobs, found)
        model = await self._store.import_staged(name or found.name, linking, linking.stage)
        report = linking.report()
        self.log.info(
            "imported {ref} as {model}: {how}", ref=found.ref, model=model.tags, how=report["message"]
        )
        return model, report

    def _header(self, found: Found) -> gguf_meta.GGUFInfo | None:
        """The header of C{found}'s weights, read once per version of its files (blocking)."""
        if not found.weights:
            return None
        try:
            stats = [os.stat(w.path) for w in found.weights]
        except OSError:
            return None
        stamp = (str(found.weights[0].path), sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats))
        if stamp not in self._headers:
            try:
                self._headers[stamp] = gguf_meta.weights(gguf_meta.read_all([w.path for w in found.weights]))
            except MrunnerError:
                self._headers[stamp] = None
        return self._headers[stamp]

    def _stored(self) -> Callable[[Found], list[str]]:
        """Which names in the store a found model has: by its files' digests, or by their inodes."""
        by_digest: dict[str, list[str]] = {}
        by_inode: dict[tuple[int, int], list[str]] = {}
        for model in self._store.list():
            if model.problem or not model.shards:
                continue
            first = self._store.manifest(model.id).gguf.digest
            by_digest.setdefault(first, []).extend(model.tags)
            try:
                stat = os.stat(model.shards[0])
            except OSError:
                continue
            by_inode.setdefault((stat.st_dev, stat.st_ino), []).extend(model.tags)

        def tags(found: Found) -> list[str]:
            if not found.weights:
                return []
            first = found.weights[0]
            if first.digest in by_digest:
                return by_digest[first.digest]
            try:
                stat = os.stat(first.path)
            except OSError:
                return []
            return by_inode.get((stat.st_dev, stat.st_ino), [])

        return tags


def _path(path: Path) -> Found:
    """The model of a GGUF file named by its path (the first shard of a split one); its folder is its root.

    A link is followed (to a Hugging Face blob, say): the person named the file.
    """
    if path.suffix.lower() != ".gguf":
        raise BadRequest(f"{str(path)[:200]} is not a .gguf file; give {FORMS}", code="invalid_source")
    real = inside(path, path.resolve().parent).path
    models, _ = groups(gguf_files(real.parent))
    group = next((g for g in models if g.weights[0] == real), None)
    if group is None and real.suffix.lower() != ".gguf":  # a link to a content-addressed blob
        group = Group(quant_tag(path.stem), path.stem, (real,))
    if group is None:
        raise BadRequest(
            f"{path} is a projector or a shard other than the first: give the model's first file"
        )
    names = (str(path), store_name(path.stem, "latest"), lower_keys(str(path)))
    return found_in("file", real.parent, group, [], names)


def _entry(
    found: Found, info: gguf_meta.GGUFInfo | None, stored: Callable[[Found], list[str]]
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": found.source,
        "ref": found.ref,
        "name": found.name,
        "path": str(found.where),
        "size": found.size,
        "quantization": info.quantization if info else "",
        "parameters": gguf_meta.format_parameters(info.parameters) if info else "",
        "architecture": info.architecture if info else "",
        "projector": found.projector is not None,
        "in_store": stored(found),
    }
    if found.problem:
        entry["problem"] = found.problem
    return entry
