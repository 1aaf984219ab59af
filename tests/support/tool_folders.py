"""Other tools' model folders, laid out as each tool writes them: Ollama's store, the Hugging Face cache,
LM Studio's folder. Files are copied in, so a test can check that an import made no second copy."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

OLLAMA_HOST = "registry.ollama.ai"
OLLAMA_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
GO_TEMPLATE = b"{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}{{ end }}"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def ollama_blob(root: Path, data: bytes) -> str:
    """Store C{data} as Ollama does, ``blobs/sha256-<hex>``; its digest."""
    digest = sha256(data)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / digest.replace(":", "-")).write_bytes(data)
    return digest


def ollama_manifest(
    gguf: Path, projector: Path | None = None, extra_layers: Sequence[dict[str, object]] = ()
) -> tuple[bytes, dict[str, bytes]]:
    """An Ollama model's manifest as its registry serves it, and its blobs by digest: config, model,
    projector, template, license and params layers."""
    blobs: dict[str, bytes] = {}

    def blob(media_type: str, data: bytes) -> dict[str, object]:
        blobs[sha256(data)] = data
        return {"mediaType": media_type, "digest": sha256(data), "size": len(data)}

    def layer(kind: str, data: bytes) -> dict[str, object]:
        return blob(f"application/vnd.ollama.image.{kind}", data)

    config = json.dumps({"model_format": "gguf", "model_family": "llama"}).encode()
    layers = [layer("model", gguf.read_bytes())]
    if projector is not None:
        layers.append(layer("projector", projector.read_bytes()))
    layers += [
        layer("template", GO_TEMPLATE),
        layer("license", b"tiny license"),
        layer("params", json.dumps({"stop": ["<|end|>"]}).encode()),
        *extra_layers,
    ]
    manifest = {
        "schemaVersion": 2,
        "mediaType": OLLAMA_MANIFEST,
        "config": blob("application/vnd.docker.container.image.v1+json", config),
        "layers": layers,
    }
    return json.dumps(manifest).encode(), blobs


def ollama_model(
    root: Path,
    name: str,
    tag: str,
    gguf: Path,
    projector: Path | None = None,
    namespace: str = "library",
    extra_layers: Sequence[dict[str, object]] = (),
) -> Path:
    """An Ollama model as ``ollama pull`` leaves it: the blobs of L{ollama_manifest}, and the manifest
    naming them; the manifest's path."""
    manifest, blobs = ollama_manifest(gguf, projector, extra_layers)
    for data in blobs.values():
        ollama_blob(root, data)
    path = root / "manifests" / OLLAMA_HOST / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(manifest)
    return path


def ollama_blob_path(root: Path, data: bytes) -> Path:
    return root / "blobs" / sha256(data).replace(":", "-")


def hf_cache_repo(root: Path, repo: str, files: dict[str, Path], revision: str = "a" * 40) -> Path:
    """A repository in the Hugging Face cache as ``huggingface_hub`` writes it: each file a blob named by
    its sha256, the snapshot's file a relative link to it, ``refs/main`` naming the revision; the
    snapshot's folder."""
    folder = root / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / revision
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        blob = folder / "blobs" / sha256(source.read_bytes()).removeprefix("sha256:")
        shutil.copyfile(source, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    return snapshot


def lmstudio_repo(root: Path, repo: str, files: dict[str, Path]) -> Path:
    """``<publisher>/<repository>/<file>.gguf`` as LM Studio downloads them; the repository's folder."""
    folder = root / repo
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        shutil.copyfile(source, folder / name)
    return folder
