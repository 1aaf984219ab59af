"""llama.cpp's own downloads (``llama-server -hf``): GGUF files side by side in its cache folder.

Found where llama.cpp looks: C{LLAMA_CACHE}, else C{XDG_CACHE_HOME}/llama.cpp,
else ``~/.cache/llama.cpp``. Its file names join the repository and the file
(``<org>_<repo>_<file>.gguf``), so a model is named by its file's stem.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from mrunner.store.sources.folders import found_in, gguf_files, groups, lower_keys, store_name
from mrunner.store.sources.found import Found

SOURCE = "llama.cpp"


def root(configured: str | None, environ: Mapping[str, str]) -> Path | None:
    if configured is not None:
        return Path(configured).expanduser() if configured else None
    if environ.get("LLAMA_CACHE"):
        return Path(environ["LLAMA_CACHE"]).expanduser()
    return Path(environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "llama.cpp"


def scan(folder: Path) -> Iterator[Found]:
    models, _ = groups(gguf_files(folder))
    for group in models:
        names = (
            f"{SOURCE}:{group.stem}",
            store_name(f"llamacpp/{group.stem}", "latest"),
            lower_keys(group.stem),
        )
        yield found_in(SOURCE, folder, group, [], names)
