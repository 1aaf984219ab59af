"""The base of the store's unit tests: a store in a temporary directory, and tiny GGUFs to import."""

from __future__ import annotations

import io
import os
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner.store.local import ModelStore
from mrunner.values.model import Model
from tests.support.ggufs import write_tiny_gguf
from tests.support.sync_reactor import SyncThreadsClock


def tiny_gguf(directory: Path, seed: int = 0, **kw: object) -> bytes:
    path = directory / f"tiny-{seed}.gguf"
    write_tiny_gguf(path, seed=seed, **kw)  # type: ignore[arg-type]
    return path.read_bytes()


class StoreTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.home = Path(self.mktemp())
        self.clock = SyncThreadsClock()
        self.clock.advance(1_700_000_000)
        self.store = ModelStore(self.home, self.clock)

    def import_model(self, name: str, seed: int = 0, **kw: object) -> Model:
        data = tiny_gguf(self.home, seed, **kw)
        return self.successResultOf(self.store.import_gguf(name, io.BytesIO(data)))

    def stored_files(self) -> list[str]:
        return sorted(os.listdir(self.home / "models" / "blobs" / "sha256"))
