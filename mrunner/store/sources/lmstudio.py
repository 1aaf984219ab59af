"""LM Studio's folder: ``<publisher>/<repository>/*.gguf`` under ``~/.lmstudio/models``.

Older LM Studio kept it in ``~/.cache/lm-studio/models``; that one is looked at
when the new one is not there. A projector beside the weights (``mmproj-*``) is
the model's projector.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from mrunner.store.sources.folders import found_in, gguf_files, groups, lower_keys, store_name, walk_dirs
from mrunner.store.sources.found import Found

SOURCE = "lmstudio"
DEFAULTS = ("~/.lmstudio/models", "~/.cache/lm-studio/models")


def root(configured: str | None, environ: Mapping[str, str]) -> Path | None:
    """C{[sources] lmstudio}, else the first of LM Studio's folders that exists."""
    if configured is not None:
        return Path(configured).expanduser() if configured else None
    folders = [Path(folder).expanduser() for folder in DEFAULTS]
    return next((folder for folder in folders if folder.is_dir()), folders[0])


def scan(folder: Path) -> Iterator[Found]:
    for repository in walk_dirs(folder, 2):
        repo = "/".join(repository.relative_to(folder).parts)
        models, projectors = groups(gguf_files(repository))
        for group in models:
            keys = lower_keys(repo, f"{repo}:{group.tag}", f"{repo}:{group.stem}")
            names = (f"{SOURCE}:{repo}:{group.tag}", store_name(f"{SOURCE}/{repo}", group.tag), keys)
            yield found_in(SOURCE, folder, group, projectors, names)
