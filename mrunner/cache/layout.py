"""Which runners may restore a state: the same model file, build and every flag that shapes the KV cache.

A state is restored only into a runner whose command line is the one that saved
it, but for the flags that change where the layers run or how fast, not what
the KV cache holds: the socket, the alias, threads, the placement on GPUs
(llama.cpp copies a state through host memory, so it restores on any device)
and the log's verbosity. Everything else counts, the context size, C{--parallel},
C{--kv-unified}, the KV cache types, flash attention and the model's own
runtime flags among it; the executable's path names the llama.cpp build.
"""

from __future__ import annotations

import hashlib

from mrunner.values.backend import Command

#: Flags (each with one value) that do not change a saved state's layout.
FREE_FLAGS = frozenset(
    {
        "--host",
        "--alias",
        "--threads",
        "-t",
        "--device",
        "--n-gpu-layers",
        "-ngl",
        "--tensor-split",
        "--fit",
        "-lv",
        "--slot-save-path",
        "--cache-ram",
    }
)


def layout(command: Command) -> str:
    """A short digest of what in C{command} a saved state depends on."""
    kept: list[str] = [command.executable]
    args = iter(command.args)
    for arg in args:
        if arg in FREE_FLAGS:
            next(args, None)
        else:
            kept.append(arg)
    return hashlib.sha256("\0".join(kept).encode()).hexdigest()[:24]


def flag_value(command: Command, flag: str) -> str | None:
    """The value C{command} gives C{flag}, the last one where it is given twice."""
    value = None
    for arg, following in zip(command.args, command.args[1:], strict=False):
        if arg == flag:
            value = following
    return value
