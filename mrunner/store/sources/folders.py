"""What the sources share: GGUF files grouped into models, and paths held inside their folder.

A tool's folder is read, never trusted: every file taken from it must be a
regular file that resolves inside the folder (a link out of it is refused, as a
manifest naming a file elsewhere is), so a crafted folder cannot make mrunner
hard-link or copy a file it was never meant to reach.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

from mrunner.store.sources.found import Found, Refused, SourceFile

#: What a model is called: its C{ref} for ``mrunner import``, its name in the store, every spelling.
Names = tuple[str, str, frozenset[str]]

#: llama.cpp's shard names: ``<prefix>-00001-of-00003.gguf``.
SHARD = re.compile(r"(?P<prefix>.*)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)
#: The quantization a file's name ends with, as publishers name them: ``...-Q4_K_M``, ``.IQ3_XS``, ``-f16``.
QUANT = re.compile(r"(?:^|[-._])((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32|FP16)$", re.IGNORECASE)
#: Most GGUF files looked at in one folder: a cache of thousands is someone else's problem, not a hang.
MAX_FILES = 4096


@attrs.frozen
class Group:
    """The GGUF files of one model in a folder: its weights (one file or every shard) and its tag."""

    tag: str
    stem: str
    weights: tuple[Path, ...]


def quant_tag(stem: str) -> str:
    """The quantization C{stem} ends with (C{Q4_K_M}), upper case; else the stem itself."""
    match = QUANT.search(stem)
    return match[1].upper() if match else stem


def is_projector(path: Path) -> bool:
    """A multimodal projector, by the name every publisher gives them (``mmproj-*.gguf``)."""
    return "mmproj" in path.name.lower()


def gguf_files(folder: Path, recursive: bool = False) -> list[Path]:
    """The ``*.gguf`` files in C{folder} (and below, C{recursive}), sorted; none when it cannot be read."""
    pattern = "**/*.gguf" if recursive else "*.gguf"
    try:
        return sorted(folder.glob(pattern))[:MAX_FILES]
    except OSError:
        return []


def groups(paths: Iterable[Path]) -> tuple[list[Group], list[Path]]:
    """The models among C{paths} (shards together, a set with one missing left out), and the projectors."""
    singles: list[Group] = []
    sets: dict[tuple[Path, str, int], dict[int, Path]] = {}
    projectors: list[Path] = []
    for path in paths:
        if is_projector(path):
            projectors.append(path)
            continue
        match = SHARD.fullmatch(path.name)
        if match is None:
            singles.append(Group(quant_tag(path.stem), path.stem, (path,)))
        else:
            key = (path.parent, match["prefix"], int(match["count"]))
            sets.setdefault(key, {})[int(match["number"])] = path
    for (_, prefix, count), shards in sets.items():
        if sorted(shards) == list(range(1, count + 1)):
            singles.append(Group(quant_tag(prefix), prefix, tuple(shards[n] for n in sorted(shards))))
    return singles, projectors


def inside(path: Path, root: Path) -> SourceFile:
    """C{path} resolved, a regular file inside C{root}.

    @raise Refused: it links outside C{root}, or is no regular file.
    """
    try:
        real = path.resolve(strict=True)
        mode = os.stat(real, follow_symlinks=False).st_mode
    except (OSError, RuntimeError) as e:  # RuntimeError: a loop of links
        raise Refused(f"{path} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    if not real.is_relative_to(root.resolve()):
        raise Refused(f"{path} leads to {real}, outside {root}: a link out of the folder is not followed")
    if not stat.S_ISREG(mode):
        raise Refused(f"{path} is not a regular file")
    return SourceFile(real)


def sha256_named(path: Path) -> str | None:
    """The digest a content-addressed file's name claims (a Hugging Face LFS blob's), if it claims one."""
    name = path.name
    return f"sha256:{name}" if len(name) == 64 and all(c in "0123456789abcdef" for c in name) else None


def found_in(
    source: str, root: Path, group: Group, projectors: list[Path], names: Names, named: bool = False
) -> Found:
    """The L{Found} model of C{group} (and the first of C{projectors}), its files held inside C{root};
    C{named}: their names are their sha256 digests, to be checked on import."""
    ref, name, keys = names
    try:
        weights = tuple(inside(path, root) for path in group.weights)
        projector = inside(projectors[0], root) if projectors else None
    except Refused as e:
        return Found(source, ref, name, group.weights[0].parent, keys=keys, problem=e.message)
    if named:
        weights = tuple(attrs.evolve(w, digest=sha256_named(w.path)) for w in weights)
        projector = projector and attrs.evolve(projector, digest=sha256_named(projector.path))
    return Found(source, ref, name, group.weights[0].parent, weights, projector, keys=keys)


def lower_keys(*spellings: str) -> frozenset[str]:
    return frozenset(spelling.lower() for spelling in spellings)


def store_name(repository: str, tag: str) -> str:
    """A name the store takes for C{repository}:C{tag}: lower case, any other character a ``-``."""
    parts = [
        re.sub(r"[^a-z0-9._-]+", "-", part.lower()).strip("._-") or "model" for part in repository.split("/")
    ]
    clean_tag = re.sub(r"[^\w.-]+", "-", tag, flags=re.ASCII).lstrip(".-")[:128] or "latest"
    return "/".join(re.sub(r"[._-]{2,}", "-", part) for part in parts) + ":" + clean_tag


def walk_dirs(root: Path, depth: int) -> Iterator[Path]:
    """The folders C{depth} levels below C{root}, sorted, not through links (a tool writes none there)."""
    level = [root]
    for _ in range(depth):
        level = sorted(
            Path(entry.path)
            for folder in level
            for entry in _entries(folder)
            if entry.is_dir(follow_symlinks=False)
        )
    yield from level


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)[:MAX_FILES]
    except OSError:
        return []
