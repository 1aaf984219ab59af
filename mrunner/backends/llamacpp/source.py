"""The pinned llama.cpp source, and where its builds of each variant are kept."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from mrunner.backends import build, variants

LLAMA_CPP_PYTHON = "0.3.36"
#: The llama.cpp commit vendored in that llama-cpp-python release.
PIN = "0c1e570"

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_CURL=OFF",
    # The sdist has no git history; without this, `--version` would say "unknown".
    f"-DLLAMA_BUILD_COMMIT={PIN}",
)

SOURCE = build.Source(
    name="llama.cpp",
    package="llama-cpp-python",
    version=LLAMA_CPP_PYTHON,
    tree="vendor/llama.cpp",
    pin=PIN,
    target="llama-server",
    cmake_flags=CMAKE_FLAGS,
)


def build_dir(root: Path, variant: str = "cpu") -> Path:
    """The pinned build of C{variant}'s directory under C{root} ($MRUNNER_HOME or the shared cache)."""
    return build.directory(root, SOURCE, variants.directory_name(PIN, variant))


def cached_executable(environ: Mapping[str, str] = os.environ, variant: str = "cpu") -> Path:
    """Where ``python -m mrunner.backends.llamacpp`` (``make backend``) puts the shared build."""
    return build.executable_in(build_dir(build.cache_root({}, environ), variant), SOURCE)
