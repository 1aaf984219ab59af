"""Where a build finds CMake, ninja, make and tar: on PATH, beside the interpreter, or in a Python package.

CMake and ninja are often installed by pip rather than by the system: into a
venv, whose ``bin`` is on PATH only while it is activated; beside a Python that
is not the system's (a lent GPU machine had them only in its Python's ``bin``,
issue 50); or with ``--target``, which leaves no script on any PATH, only the
packages' own folders (``cmake.CMAKE_BIN_DIR``, ``ninja.BIN_DIR``). Each is
taken from the first of these places that has it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

#: The programs a Python package may hold: the package, and its attribute naming their folder.
PACKAGES = {"cmake": ("cmake", "CMAKE_BIN_DIR"), "ninja": ("ninja", "BIN_DIR")}


def find(name: str, environ: Mapping[str, str], python: str) -> str | None:
    """C{name}'s path: on C{environ}'s PATH, else beside C{python} (the folder it was started from,
    then the one it links to: ``/usr/bin/python3`` may be a link into the folder that has CMake),
    else in its Python package."""
    beside = (str(Path(python).parent), str(Path(python).resolve().parent))
    for folder in (environ.get("PATH", os.defpath), *beside, package_folder(name)):
        if folder and (found := shutil.which(name, path=folder)):
            return found
    return None


def package_folder(name: str) -> str | None:
    """The folder of C{name}'s binary in its installed Python package (L{PACKAGES}), else None.

    A bare ``cmake`` directory on C{sys.path} (llama.cpp's source tree has one) is
    a namespace package with no origin, not CMake's package: it is passed over.
    """
    if name not in PACKAGES:
        return None
    module, attribute = PACKAGES[name]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    try:
        return str(getattr(importlib.import_module(module), attribute))
    except (ImportError, AttributeError):
        return None
