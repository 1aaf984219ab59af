"""Tiny GGUF files for tests: real headers, a couple of small tensors, a few KB; packages of them; damage."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
from gguf import GGUFWriter, LlamaFileType


def write_tiny_gguf(
    path: str | os.PathLike[str],
    *,
    architecture: str = "llama",
    context_length: int | None = 2048,
    file_type: LlamaFileType | None = LlamaFileType.MOSTLY_Q4_1,
    name: str = "tiny",
    rows: int = 8,
    seed: int = 0,
    shards: bool = False,
) -> int:
    """Write a GGUF file at C{path}; return its parameter count.

    C{seed} changes the tensor contents, so files with different seeds have different digests.
    With C{shards}, each tensor goes to a file of its own, named as llama.cpp's
    ``gguf-split`` names them (``tiny.gguf`` → ``tiny-00001-of-00002.gguf``, ...).
    """
    writer = GGUFWriter(os.fspath(path), architecture, split_max_tensors=1 if shards else 0)
    writer.add_name(name)
    if context_length is not None:
        writer.add_context_length(context_length)
    if file_type is not None:
        writer.add_file_type(file_type)
    weights = np.random.default_rng(seed).standard_normal((rows, 16)).astype(np.float32)
    norm = np.ones(16, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weights)
    writer.add_tensor("output_norm.weight", norm)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights.size + norm.size


def flip_last_byte(path: str | os.PathLike[str]) -> None:
    """Corrupt a file as a bad disk would: same size, one bit changed."""
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))


def package(files: list[tuple[str, bytes]]) -> bytes:
    """A tar of C{files} (name, content), as ``mrunner package`` sends one."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
