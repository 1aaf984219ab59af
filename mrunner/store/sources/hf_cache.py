"""The Hugging Face cache: ``models--<org>--<repo>/snapshots/<revision>/…`` linking into ``blobs/``.

Found where ``huggingface_hub`` puts it: C{HF_HUB_CACHE}, else C{HF_HOME}/hub,
else C{XDG_CACHE_HOME}/huggingface/hub, else ``~/.cache/huggingface/hub``. The
revision is the one C{refs/main} names, else the newest snapshot. A snapshot's
file must link into its repository's ``blobs/``: a link out of the cache is
refused. A Git LFS blob is named by its sha256, checked when it is imported.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from mrunner.store.sources.folders import Group, found_in, gguf_files, groups, lower_keys, store_name
from mrunner.store.sources.found import Found

SOURCE = "hf-cache"
REVISION = re.compile(r"[\w.-]{1,128}", re.ASCII)


def root(configured: str | None, environ: Mapping[str, str]) -> Path | None:
    """C{[sources] huggingface}, else where C{huggingface_hub} looks, as it looks."""
    if configured is not None:
        return Path(configured).expanduser() if configured else None
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    home = environ.get("HF_HOME") or str(Path(environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def scan(folder: Path) -> Iterator[Found]:
    """Each GGUF model (a file, or a split set) in each repository's current snapshot."""
    for repository in sorted(folder.glob("models--*--*")):
        org, _, name = repository.name.removeprefix("models--").partition("--")
        snapshot = _snapshot(repository)
        if snapshot is None:
            continue
        models, projectors = groups(gguf_files(snapshot, recursive=True))
        for group in models:
            yield found_in(SOURCE, repository / "blobs", group, projectors, _names(org, name, group), True)


def _snapshot(repository: Path) -> Path | None:
    """The snapshot C{refs/main} names, else the newest one; None without one."""
    try:
        revision = (repository / "refs" / "main").read_text().strip()
    except (OSError, UnicodeDecodeError):
        revision = ""
    if REVISION.fullmatch(revision) and (repository / "snapshots" / revision).is_dir():
        return repository / "snapshots" / revision
    try:
        snapshots = [path for path in (repository / "snapshots").iterdir() if path.is_dir()]
    except OSError:
        return None
    return max(snapshots, key=lambda path: path.stat().st_mtime, default=None)


def _names(org: str, name: str, group: Group) -> tuple[str, str, frozenset[str]]:
    repo = f"{org}/{name}"
    keys = lower_keys(repo, f"{repo}:{group.tag}", f"{repo}:{group.stem}")  # the repository alone: if one
    return f"{SOURCE}:{repo}:{group.tag}", store_name(f"hf.co/{repo}", group.tag), keys
