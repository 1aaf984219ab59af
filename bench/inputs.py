"""The ``llama-server`` the bench runs: the one mrunner would use."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from mrunner.backends.llamacpp.source import cached_executable

#: Overrides the executable, e.g. a finished build that is not in the shared cache yet.
EXECUTABLE_VARIABLE = "MRUNNER_BENCH_LLAMA_SERVER"


class MissingInput(Exception):
    """Something the bench needs is not installed; the message says how to get it."""


def llama_server(environ: Mapping[str, str] = os.environ) -> Path:
    """The override, else the pinned build in the shared cache (where ``make backend`` puts it), else PATH."""
    override = environ.get(EXECUTABLE_VARIABLE)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise MissingInput(f"{EXECUTABLE_VARIABLE}={override} is not a file")
        return path
    cached = cached_executable(environ)
    if cached.is_file():
        return cached
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    raise MissingInput(
        f"no llama-server: not at {cached} nor on PATH; run `make backend` or set {EXECUTABLE_VARIABLE}"
    )
