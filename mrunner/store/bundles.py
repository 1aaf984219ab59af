"""Directories that give a split model's shards the names llama.cpp expects (``models/bundles``).

llama-server is handed the first shard and opens the others by names it
derives from the first one's; the blobs are named by digest, so a model's
directory holds symbolic links to them (never copies). It is made in a temp
directory and renamed, so a load never sees half of it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Container, Sequence
from pathlib import Path


def shard_name(number: int, count: int) -> str:
    """The name llama.cpp gives shard C{number} (from 1) of C{count}, and looks for beside the first."""
    return f"model-{number:05d}-of-{count:05d}.gguf"


class Bundles:
    """One directory per split model under C{root}, named by its manifest digest's hex."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def first(self, digest: str, count: int) -> str:
        """The path a runner opens for the model C{digest} split in C{count} shards."""
        return str(self._directory(digest) / shard_name(1, count))

    def link(self, digest: str, shards: Sequence[str]) -> None:
        """Make (or keep) the directory of the model C{digest} whose shards are the files C{shards},
        in order (absolute paths)."""
        directory = self._directory(digest)
        links = {directory / shard_name(n, len(shards)): target for n, target in enumerate(shards, 1)}
        if all(os.path.islink(link) and os.readlink(link) == target for link, target in links.items()):
            return
        temp = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}.tmp")
        temp.mkdir(parents=True)
        for link, target in links.items():
            os.symlink(target, temp / link.name)
        shutil.rmtree(directory, ignore_errors=True)
        os.rename(temp, directory)

    def remove_stale(self, stored: Container[str]) -> None:
        """Remove the directories of models not C{stored} (by manifest digest), and temps a crash left."""
        if not self._root.is_dir():
            return
        for entry in os.scandir(self._root):
            if entry.name.endswith(".tmp") or f"sha256:{entry.name}" not in stored:
                shutil.rmtree(entry.path, ignore_errors=True)

    def _directory(self, digest: str) -> Path:
        return self._root / digest.removeprefix("sha256:")
