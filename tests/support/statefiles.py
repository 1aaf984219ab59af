"""llama.cpp sequence-state files as llama-server writes them, for the prompt cache's unit tests."""

from __future__ import annotations

import struct
from pathlib import Path

from mrunner.cache.statefile import MAGIC, PACKED, VERSION


def state_bytes(tokens: list[int], state: bytes = b"\x01" * 64, packed: bool = True) -> bytes:
    """A state file's bytes: its head, C{tokens} (packed as llama-server packs them, or plain), C{state}."""
    if packed:
        words = struct.pack(f"<iII{len(tokens)}iI", -1, PACKED, len(tokens), *tokens, 0)
    else:
        words = struct.pack(f"<{len(tokens)}i", *tokens)
    return struct.pack("<III", MAGIC, VERSION, len(words) // 4) + words + state


def write_state(path: Path, tokens: list[int], **kwargs: object) -> Path:
    path.write_bytes(state_bytes(tokens, **kwargs))  # type: ignore[arg-type]
    return path
