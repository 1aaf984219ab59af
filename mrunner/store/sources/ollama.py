"""Ollama's store: ``manifests/<host>/<namespace>/<name>/<tag>`` naming layers kept as ``blobs/sha256-<hex>``.

Found where Ollama looks: C{OLLAMA_MODELS}, else ``~/.ollama/models``. A layer
is reached only by its digest, checked to be one, so a manifest cannot name a
file outside the blobs folder; the blob must be a regular file there (Ollama
writes no links), and its digest is checked when it is imported.

Ollama's template layer is a Go template, which llama-server does not run: the
GGUF's own chat template is used, and the import says so. Its params layer
(stop words, sampling defaults) is not carried over either. A pull from Ollama's
registry (L{mrunner.store.ollama_pull}) takes the same layers (L{choose}).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from mrunner.names import DIGEST, OLLAMA, OLLAMA_NAMESPACE
from mrunner.store.sources.folders import inside, lower_keys, store_name, walk_dirs
from mrunner.store.sources.found import Found, Refused, SourceFile

SOURCE = "ollama"
REGISTRY = "registry.ollama.ai"
LIBRARY = OLLAMA_NAMESPACE
MEDIA = "application/vnd.ollama.image."
MODEL, PROJECTOR, TEMPLATE, LICENSE, PARAMS, ADAPTER = (
    MEDIA + kind for kind in ("model", "projector", "template", "license", "params", "adapter")
)
MAX_MANIFEST = 1024 * 1024
GO_TEMPLATE = (
    "Ollama's template is a Go template, which llama-server does not run:"
    " the GGUF's own chat template is used"
)
NO_TEMPLATE = "the GGUF has no chat template of its own either: llama-server's default (ChatML) is used"


def root(configured: str | None, environ: Mapping[str, str]) -> Path | None:
    """Where Ollama keeps its models: C{[sources] ollama}, else C{OLLAMA_MODELS}, else its default."""
    if configured is not None:
        return Path(configured).expanduser() if configured else None
    return Path(environ.get("OLLAMA_MODELS") or "~/.ollama/models").expanduser()


def scan(folder: Path) -> Iterator[Found]:
    """Every model Ollama has in C{folder}, one per manifest (a tag)."""
    manifests = folder / "manifests"
    for tag_dir in walk_dirs(manifests, 3):
        try:
            entries = sorted(tag_dir.iterdir())
        except OSError:
            continue
        for manifest in entries:
            if manifest.is_file() or manifest.is_symlink():
                yield _found(folder, manifest, manifest.relative_to(manifests).parts)


def _found(folder: Path, manifest: Path, parts: tuple[str, ...]) -> Found:
    host, namespace, name, tag = parts
    short = f"{namespace}/{name}" if namespace != LIBRARY or host != REGISTRY else name
    full = f"{host}/{namespace}/{name}"
    keys = lower_keys(f"{short}:{tag}", f"{namespace}/{name}:{tag}", f"{full}:{tag}")
    if tag == "latest":
        keys |= lower_keys(short, f"{namespace}/{name}", full)
    repository = f"{OLLAMA}/{namespace}/{name}" if host == REGISTRY else full
    found = Found(SOURCE, f"{SOURCE}:{short}:{tag}", store_name(repository, tag), manifest, keys=keys)
    try:
        return _layers(found, folder, _read_manifest(inside(manifest, folder).path))
    except Refused as e:
        return attrs.evolve(found, problem=e.message)


def _read_manifest(path: Path) -> list[dict[str, Any]]:
    """The layers of the manifest at C{path}; @raise Refused: not one Ollama writes."""
    if os.path.getsize(path) > MAX_MANIFEST:
        raise Refused(f"the manifest {path} is over {MAX_MANIFEST} bytes")
    return manifest_layers(path.read_bytes(), f"the manifest {path}")


def manifest_layers(data: bytes, what: str) -> list[dict[str, Any]]:
    """The layers of an Ollama manifest, C{what} in messages; @raise Refused: not one Ollama writes."""
    try:
        layers = json.loads(data).get("layers")
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        raise Refused(f"{what} is not Ollama's JSON") from None
    if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
        raise Refused(f"{what} has no list of layers")
    return layers


@attrs.frozen
class Chosen:
    """What mrunner takes of an Ollama model's layers (each a manifest's entry), and notes on the rest."""

    model: dict[str, Any]
    projector: dict[str, Any] | None
    licenses: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]


def choose(layers: list[dict[str, Any]]) -> Chosen:
    """The model layer (one), a projector, licenses; notes on what is left out (its template, its params).

    @raise Refused: not one model layer, a LoRA adapter, several projectors.
    """
    files: dict[str, list[dict[str, Any]]] = {MODEL: [], PROJECTOR: [], LICENSE: [], ADAPTER: []}
    notes: list[str] = []
    for layer in layers:
        kind = layer.get("mediaType")
        if kind == TEMPLATE:
            notes.append(GO_TEMPLATE)
        elif kind == PARAMS:
            notes.append("Ollama's params (stop words, sampling defaults) are not carried over")
        elif kind in files:
            files[kind].append(layer)
    if len(files[MODEL]) != 1:
        raise Refused(f"the manifest names {len(files[MODEL])} model layers; one is what Ollama serves")
    if files[ADAPTER]:
        raise Refused("the model has a LoRA adapter layer, which mrunner does not apply")
    if len(files[PROJECTOR]) > 1:
        raise Refused("the manifest names more than one projector")
    projector = files[PROJECTOR][0] if files[PROJECTOR] else None
    return Chosen(files[MODEL][0], projector, tuple(files[LICENSE]), tuple(notes))


def template_notes(notes: Sequence[str], metadata: Mapping[str, Any]) -> list[str]:
    """C{notes}, and which chat template serves when Ollama's is left out and the GGUF (C{metadata}) has
    none either."""
    missing = GO_TEMPLATE in notes and "tokenizer.chat_template" not in metadata
    return [*notes, NO_TEMPLATE] if missing else list(notes)


def _layers(found: Found, folder: Path, layers: list[dict[str, Any]]) -> Found:
    """C{found} with the files of the layers mrunner takes (L{choose}), each a blob in C{folder}."""
    chosen = choose(layers)
    return attrs.evolve(
        found,
        weights=(_blob(folder, chosen.model),),
        projector=_blob(folder, chosen.projector) if chosen.projector else None,
        licenses=tuple(_blob(folder, layer) for layer in chosen.licenses),
        notes=chosen.notes,
    )


def _blob(folder: Path, layer: dict[str, Any]) -> SourceFile:
    """The blob a layer names, by its digest only; @raise Refused: no sha256 digest, or not a file here."""
    digest, size = layer.get("digest"), layer.get("size")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise Refused(f"a layer names {str(digest)[:80]!r}, not a sha256 digest of a blob in {folder}/blobs")
    name = digest.replace(":", "-")
    blob = inside(folder / "blobs" / name, folder / "blobs")
    if blob.path != (folder / "blobs").resolve() / name:
        raise Refused(f"the blob of {digest} is a link: Ollama writes none, so it is not followed")
    if isinstance(size, int) and size != blob.size:
        raise Refused(f"the blob of {digest} holds {blob.size} bytes; the manifest says {size}")
    return attrs.evolve(blob, digest=digest)
