"""``mrunner package``: a GGUF file (or shard set) and its files, streamed to the daemon as one tar.

The tar is written on the fly with its length known beforehand, so a model
of many gigabytes needs no temporary copy and the upload can show progress.
"""

from __future__ import annotations

import re
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from mrunner.cli.errors import CommandError

BLOCK = 512
WHISPER_MAGIC = b"lmgg"
CHUNK = 1024 * 1024
#: llama.cpp's shard names: ``<prefix>-00001-of-00003.gguf``.
SHARD = re.compile(r"(?P<prefix>.*)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf")


def shards(first: Path) -> list[Path]:
    """C{first}, or every shard of the split set C{first} is the first of, in order."""
    match = SHARD.fullmatch(first.name)
    if match is None:
        return [first]
    if int(match["number"]) != 1:
        raise CommandError(f"{first} is shard {int(match['number'])} of a split model: give the first shard")
    count = int(match["count"])
    paths = [first.with_name(f"{match['prefix']}-{n:05d}-of-{count:05d}.gguf") for n in range(1, count + 1)]
    missing = [path.name for path in paths if not path.is_file()]
    if missing:
        raise CommandError(f"the split model {first.name} lacks {', '.join(missing)} in {first.parent}")
    return paths


def members(
    gguf: Path, licenses: Sequence[Path], mmproj: Path | None = None, chat_template: Path | None = None
) -> list[tuple[str, Path]]:
    """Names in the archive as the daemon expects them (see L{mrunner.store.package})."""
    weights = shards(gguf)
    names = (
        ["model.gguf"]
        if len(weights) == 1
        else [f"model-{n:05d}-of-{len(weights):05d}.gguf" for n in range(1, len(weights) + 1)]
    )
    files = [*zip(names, weights, strict=True)]
    files += [(f"licenses/{i}-{path.name}", path) for i, path in enumerate(licenses)]
    files += [(f"mmproj/{mmproj.name}", mmproj)] if mmproj else []
    files += [(f"chat-template/{chat_template.name}", chat_template)] if chat_template else []
    return files


def is_whisper(path: Path) -> bool:
    """Whether C{path} starts as a whisper.cpp ggml model (its magic, C{ggml} little-endian), read or not."""
    try:
        with path.open("rb") as f:
            return f.read(4) == WHISPER_MAGIC
    except OSError:
        return False


def whisper_members(model: Path, licenses: Sequence[Path]) -> list[tuple[str, Path]]:
    """A Whisper model's package: its weights as C{model.bin} (which the daemon reads as one), licenses."""
    return [("model.bin", model), *((f"licenses/{i}-{path.name}", path) for i, path in enumerate(licenses))]


class TarStream:
    """An uncompressed tar of C{(name, path)} pairs, produced chunk by chunk."""

    def __init__(self, files: Sequence[tuple[str, Path]]) -> None:
        try:
            self._files = [(path, path.stat().st_size) for _, path in files]
        except OSError as e:
            raise CommandError(f"cannot read {e.filename}: {e.strerror}") from None
        now = int(time.time())
        self._headers = [
            _header(name, size, now) for (name, _), (_, size) in zip(files, self._files, strict=True)
        ]
        self.length = 2 * BLOCK + sum(
            len(header) + _padded(size) for header, (_, size) in zip(self._headers, self._files, strict=True)
        )

    def chunks(self, sent: Callable[[int], None]) -> Iterator[bytes]:
        """The archive's bytes; C{sent} is told how many have gone, out of L{length}, after each chunk."""
        total = 0
        for chunk in self._parts():
            yield chunk
            total += len(chunk)
            sent(total)

    def _parts(self) -> Iterator[bytes]:
        for header, (path, size) in zip(self._headers, self._files, strict=True):
            yield header
            with path.open("rb") as f:
                left = size
                while left:
                    chunk = f.read(min(CHUNK, left))
                    if not chunk:
                        raise CommandError(f"{path} shrank while it was being sent")
                    left -= len(chunk)
                    yield chunk
            yield bytes(_padded(size) - size)
        yield bytes(2 * BLOCK)


def _header(name: str, size: int, mtime: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")  # PAX: sizes past 8 GiB


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK
