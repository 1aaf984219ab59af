"""What the rest of mrunner knows of a stored model: the values the store's interfaces speak in.

The store makes them (L{mrunner.names} parses a L{Reference}, the index
resolves a L{Model}); every other layer only reads them, so they live here,
importing nothing of mrunner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

#: Docker's answer to a delete: C{[{"Untagged": tag}, ..., {"Deleted": digest}]}.
Deletion = list[dict[str, str]]
#: A verification's report per model: C{{"id", "tags", "status": "ok"|"corrupt", "problem"?, "blobs"}}.
Reports = list[dict[str, Any]]
#: The content type of a package tar, as C{mrunner package} sends it (see L{mrunner.store.package}).
TAR = b"application/x-tar"


@attrs.frozen
class Reference:
    """A parsed model reference; ``registry`` is empty for the default registry."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """``[registry/]repository``, without tag or digest."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    def __str__(self) -> str:
        text = self.name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def names_registry(name: str) -> bool:
    """Whether the normalised C{name} names its registry (C{localhost:5000/ai/x:latest}); Docker Hub's is
    never named."""
    first, slash, _ = name.partition("/")
    return bool(slash) and _is_host(first)


def _is_host(first: str) -> bool:
    """Whether a name's first component is a registry's host, as Docker tells them apart."""
    return "." in first or ":" in first or first == "localhost" or first.startswith("[")


@attrs.frozen
class Model:
    """A model in the local store, as resolved from one of its names.

    ``id`` is the manifest digest (``sha256:<hex>``); tags of one digest are one
    model and share a runner. ``gguf`` is the path a runner opens: the weights
    blob, or for a split model the first shard's link beside the others.
    ``shards`` are the weights blobs in order; ``files`` other layers by role
    (``mmproj``, ``chat_template``, ``license``...).
    """

    id: str
    tags: tuple[str, ...]
    created: int
    config: Mapping[str, Any]
    gguf: str
    shards: tuple[str, ...] = ()
    files: Mapping[str, str] = attrs.field(factory=dict)
    problem: str | None = None

    @property
    def weights(self) -> tuple[str, ...]:
        """Paths of every weights file (all shards), for sizes."""
        return self.shards or (self.gguf,)

    @property
    def trained_context(self) -> int | None:
        """The context it was trained for (GGUF C{<arch>.context_length}), None when unknown."""
        metadata = self.config.get("gguf") or {}
        architecture = self.config.get("architecture") or metadata.get("general.architecture")
        try:
            return int(metadata[f"{architecture}.context_length"])
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def chosen_context(self) -> int | None:
        """The context size its config names when someone chose it (at import or packaging), None when
        it names none or the one it was trained for (which the store records for every GGUF)."""
        named = self.config.get("context_size")
        return None if not named or named == self.trained_context else int(named)

    @property
    def short_id(self) -> str:
        return self.id.split(":", 1)[-1][:12]

    @property
    def name(self) -> str:
        """The one name that stands for the model where no request names it (C{ps}, the page, an
        alias's C{alias_of}, the runner's C{--alias}): its first tag on the default registry, as a
        person types it (C{ai/smollm2:latest}, not C{localhost:5000/ai/smollm2:latest}), else its
        first tag, else its short id."""
        default = (tag for tag in self.tags if not names_registry(tag))
        return next(default, self.tags[0] if self.tags else self.short_id)
