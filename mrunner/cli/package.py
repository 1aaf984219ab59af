"""``mrunner package``: a GGUF file and its licenses, streamed to the daemon as one tar.

The tar is written on the fly with its length known beforehand, so a model
of many gigabytes needs no temporary copy and the upload can show progress.
"""

from __future__ import annotations

import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from mrunner.cli.errors import CommandError

BLOCK = 512
CHUNK = 1024 * 1024


def members(gguf: Path, licenses: Sequence[Path]) -> list[tuple[str, Path]]:
    """Names in the archive as the daemon expects them: one C{.gguf}, licenses under C{licenses/}."""
    return [("model.gguf", gguf), *((f"licenses/{i}-{path.name}", path) for i, path in enumerate(licenses))]


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
