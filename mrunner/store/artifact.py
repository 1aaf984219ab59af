"""Docker Model Runner's OCI artifact format: media types, the config blob, the manifest.

Models are stored and exchanged exactly as ``docker model`` publishes them, so
every model in a registry for Docker Model Runner works here, and back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import attrs

from mrunner.names import DIGEST

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
MODEL_CONFIG = "application/vnd.docker.ai.model.config.v0.1+json"
GGUF = "application/vnd.docker.ai.gguf.v3"
LICENSE = "application/vnd.docker.ai.license"
CHAT_TEMPLATE = "application/vnd.docker.ai.chat.template.jinja"
MMPROJ = "application/vnd.docker.ai.mmproj"
#: A whisper.cpp ggml model's weights: mrunner's own type, in Docker Model Runner's style (it has none).
WHISPER = "application/vnd.mrunner.ai.whisper.ggml.v1"
#: The layers that are a model's weights: a GGUF file (or its shards), or one Whisper model.
WEIGHTS = (GGUF, WHISPER)

# Layers other than the weights are files of the model, found by role.
ROLES = {
    LICENSE: "license",
    CHAT_TEMPLATE: "chat_template",
    MMPROJ: "mmproj",
}

# Blobs that are small by nature, and read whole (the config is served in every model list):
# a registry announcing more is refused before anything is downloaded.
MAX_SIZES = {MODEL_CONFIG: 1024 * 1024, LICENSE: 1024 * 1024, CHAT_TEMPLATE: 1024 * 1024}


#: A model's file: one on disk, a layer in a registry, a file the Hub lists.
File = TypeVar("File")


class InvalidManifest(ValueError):
    """A manifest or config that is not a Docker Model Runner artifact; the message says why."""


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(value: Mapping[str, Any]) -> bytes:
    """Stable JSON bytes, so the same model always has the same digest."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


@attrs.frozen
class Descriptor:
    """A reference to a blob: its media type, digest and size."""

    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def of(cls, media_type: str, data: bytes) -> Descriptor:
        return cls(media_type, sha256(data), len(data))

    @classmethod
    def from_json(cls, value: object) -> Descriptor:
        if not isinstance(value, dict):
            raise InvalidManifest("a descriptor is not an object")
        media_type, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
        annotations = value.get("annotations") or {}
        if not isinstance(media_type, str) or not isinstance(digest, str):
            raise InvalidManifest("a descriptor lacks mediaType or digest")
        if not DIGEST.fullmatch(digest):
            raise InvalidManifest(f"unsupported digest {digest[:80]!r}: only sha256 is supported")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidManifest(f"descriptor {digest} has no valid size")
        if not isinstance(annotations, dict):
            raise InvalidManifest(f"descriptor {digest} has invalid annotations")
        return cls(media_type, digest, size, {str(k): str(v) for k, v in annotations.items()})

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if self.annotations:
            value["annotations"] = dict(self.annotations)
        return value


@attrs.frozen
class Manifest:
    """An image manifest whose config is a model config and whose layers are the model's files."""

    config: Descriptor
    layers: tuple[Descriptor, ...]
    media_type: str = OCI_MANIFEST

    @property
    def blobs(self) -> tuple[Descriptor, ...]:
        return (self.config, *self.layers)

    @property
    def gguf(self) -> Descriptor:
        return self.shards[0]

    @property
    def shards(self) -> tuple[Descriptor, ...]:
        """The weights layers in manifest order: one file, or the shards of a split GGUF model."""
        return tuple(layer for layer in self.layers if layer.media_type in WEIGHTS)

    def oversized(self) -> Descriptor | None:
        """The first blob larger than L{MAX_SIZES} allows its type, if any."""
        return next((b for b in self.blobs if b.size > MAX_SIZES.get(b.media_type, b.size)), None)

    def role(self, digest: str) -> str:
        """What the blob C{digest} is to the model, for messages: weights, config, license, ..."""
        if digest == self.config.digest:
            return "config"
        shards = [shard.digest for shard in self.shards]
        if digest in shards:
            return (
                "weights"
                if len(shards) == 1
                else f"weights shard {shards.index(digest) + 1} of {len(shards)}"
            )
        return next(
            (ROLES.get(b.media_type, b.media_type) for b in self.layers if b.digest == digest), "blob"
        )

    def files(self) -> dict[str, str]:
        """Role (``license``, ``chat_template``, ``mmproj``, or the media type) → digest, weights excluded."""
        files: dict[str, str] = {}
        for layer in self.layers:
            if layer.media_type in WEIGHTS:
                continue
            role = ROLES.get(layer.media_type, layer.media_type)
            key, n = role, 1
            while key in files:
                key, n = f"{role}.{n}", n + 1
            files[key] = layer.digest
        return files

    def to_bytes(self) -> bytes:
        return canonical(
            {
                "schemaVersion": 2,
                "mediaType": self.media_type,
                "config": self.config.to_json(),
                "layers": [layer.to_json() for layer in self.layers],
            }
        )


def parse_manifest(data: bytes) -> Manifest:
    """The L{Manifest} in C{data}.

    @raise InvalidManifest: not JSON, not schema 2, or without GGUF weights.
    """
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: "[" nested past the limit
        raise InvalidManifest("the manifest is not JSON") from None
    if not isinstance(value, dict) or value.get("schemaVersion") != 2:
        raise InvalidManifest("the manifest is not an OCI or Docker schema 2 manifest")
    media_type = value.get("mediaType", OCI_MANIFEST)
    if media_type not in MANIFEST_TYPES:
        raise InvalidManifest(f"unsupported manifest type {str(media_type)[:100]!r}")
    layers = value.get("layers")
    if not isinstance(layers, list):
        raise InvalidManifest("the manifest has no layers")
    manifest = Manifest(
        Descriptor.from_json(value.get("config")),
        tuple(Descriptor.from_json(layer) for layer in layers),
        media_type,
    )
    if manifest.config.media_type != MODEL_CONFIG:
        raise InvalidManifest(
            f"not a model: config type is {manifest.config.media_type[:100]!r}, not {MODEL_CONFIG}"
        )
    if not any(layer.media_type in WEIGHTS for layer in manifest.layers):
        raise InvalidManifest("the model has no GGUF or Whisper layer; only those models are supported")
    return manifest


def layered(
    weights: Sequence[File], licenses: Sequence[File] = (), projector: File | None = None
) -> list[tuple[str, File]]:
    """A model's files as its layers (media type, file), in the order mrunner writes them: the weights,
    the licenses, the projector last."""
    layers = [(GGUF, f) for f in weights] + [(LICENSE, f) for f in licenses]
    return layers + ([(MMPROJ, projector)] if projector is not None else [])


def model_config(config: Mapping[str, Any], created: float, layers: Iterable[Descriptor]) -> bytes:
    """The config blob of a new model whose weights were described by C{config}."""
    layers = list(layers)
    return canonical(
        {
            "config": dict(config),
            "descriptor": {"created": rfc3339(created)},
            "files": [{"diffID": layer.digest, "type": layer.media_type} for layer in layers],
            "rootfs": {"type": "rootfs", "diff_ids": [layer.digest for layer in layers]},
        }
    )


def parse_config(data: bytes) -> tuple[dict[str, Any], int]:
    """The ``config`` object and the creation time (unix seconds) of a model config blob."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidManifest("the model config is not JSON") from None
    if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
        raise InvalidManifest("the model config has no config object")
    descriptor = value.get("descriptor")
    created = descriptor.get("created") if isinstance(descriptor, dict) else None
    return value["config"], parse_rfc3339(created) if isinstance(created, str) else 0


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def parse_rfc3339(text: str) -> int:
    """Unix seconds of an RFC 3339 time as Go writes it (nanoseconds, ``Z``); 0 if unreadable."""
    head, dot, rest = text.partition(".")
    if dot:  # Python reads at most microseconds: drop the fraction, keep the zone.
        zone = rest.lstrip("0123456789")
        text = head + zone
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0
