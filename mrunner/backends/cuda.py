"""What a CUDA build of llama-server needs beyond ``-DGGML_CUDA=ON``: cuBLAS, architectures, rpath.

- cuBLAS: the toolkit's own when it has it, else the PyPI wheel for the ``nvcc`` found
  (``nvidia-cublas`` for CUDA 13, ``nvidia-cublas-cu12`` for 12, of the same minor
  release, as cuBLAS numbers its releases after the toolkit's), from mrunner's own
  environment when installed there, else installed by pip beside the build (as the
  source is fetched), and named to CMake by path, with the wheel's headers.
- architectures: each GPU's compute capability (NVML, else ``nvidia-smi``); without a
  GPU, llama.cpp's own list for the toolkit (C{CUDAARCHS} in the environment wins).
- the CUDA driver library: a host with no ``libcuda.so`` to link (a build machine
  without a driver) builds with ``GGML_CUDA_NO_VMM``, which does not need it.
"""

from __future__ import annotations

import re
import shutil
import site
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mrunner.backends import childprocess
from mrunner.backends.build import InstallFailed
from mrunner.devices.nvml import Nvml

_RELEASE = re.compile(r"release (\d+)\.(\d+)")
DRIVER_LIBRARIES = ("/usr/lib/x86_64-linux-gnu/libcuda.so", "/usr/lib64/libcuda.so", "/usr/lib/libcuda.so")

Run = Callable[[Sequence[str]], Awaitable[list[str]]]


def wheel_name(major: int) -> str:
    """The PyPI wheel with cuBLAS for CUDA C{major}."""
    return "nvidia-cublas" if major >= 13 else f"nvidia-cublas-cu{major}"


def toolkit_root(nvcc: str) -> Path:
    return Path(nvcc).resolve().parent.parent


def toolkit_libraries(root: Path) -> list[Path]:
    return [root / "lib64", *sorted(root.glob("targets/*/lib"))]


def find_cublas(roots: Sequence[Path], major: int) -> tuple[Path, Path] | None:
    """(library, include directory) of a cuBLAS for CUDA C{major} under C{roots}, else None."""
    for root in roots:
        for library in sorted(root.glob(f"**/libcublas.so.{major}")):
            include = library.parent.parent / "include"
            if (include / "cublas_v2.h").exists():
                return library, include
    return None


def capabilities(nvml: Nvml | None, smi_lines: Sequence[str]) -> list[str]:
    """The GPUs' compute capabilities as CMake names them (C{["89"]}): NVML's, else ``nvidia-smi``'s."""
    if nvml is not None and (found := nvml.compute_capabilities()):
        return found
    found = [line.strip().replace(".", "") for line in smi_lines if re.fullmatch(r"\s*\d+\.\d+\s*", line)]
    return list(dict.fromkeys(found))


async def flags(
    reactor: Any, nvcc: str, cache: Path, environ: Mapping[str, str], python: str = sys.executable
) -> list[str]:
    """The CMake flags a CUDA build with C{nvcc} needs here; cuBLAS installed under C{cache} if need be."""

    async def output(argv: Sequence[str]) -> list[str]:
        return list((await childprocess.run(reactor, argv, keep=50)).tail)

    version = "\n".join(await output([nvcc, "--version"]))
    release = _RELEASE.search(version)
    if release is None:
        raise InstallFailed(f"cannot read the CUDA release from `{nvcc} --version`")
    major, minor = int(release[1]), int(release[2])
    root = toolkit_root(nvcc)
    result = [f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    rpath = [str(path) for path in toolkit_libraries(root)]
    if find_cublas(toolkit_libraries(root), major) is None:
        wheels = cache / f"cublas-cu{major}"
        found = find_cublas([*map(Path, site.getsitepackages()), wheels], major)
        if found is None:
            await output(
                [
                    *(
                        python,
                        "-m",
                        "pip",
                        "install",
                        "--no-deps",
                        "--no-input",
                        "--disable-pip-version-check",
                    ),
                    *("--target", str(wheels), f"{wheel_name(major)}=={major}.{minor}.*"),
                ]
            )
            found = find_cublas([wheels], major)
        if found is None:
            raise InstallFailed(f"no cuBLAS for CUDA {major} in the toolkit or in {wheel_name(major)}")
        library, include = found
        lt = library.with_name(f"libcublasLt.so.{major}")
        result += [f"-DCUDA_cublas_LIBRARY={library}", f"-DCUDA_cublasLt_LIBRARY={lt}"]
        result += [f"-DCMAKE_CUDA_FLAGS=-I{include}", f"-DCMAKE_CXX_FLAGS=-I{include}"]
        rpath.append(str(library.parent))
    result.append(f"-DCMAKE_BUILD_RPATH={';'.join(rpath)}")
    stubs = [str(directory / "stubs" / "libcuda.so") for directory in toolkit_libraries(root)]
    if not any(Path(path).exists() for path in (*DRIVER_LIBRARIES, *stubs)):
        result.append("-DGGML_CUDA_NO_VMM=ON")
    if "CUDAARCHS" not in environ:
        smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
        try:
            lines = await output([smi, "--query-gpu=compute_cap", "--format=csv,noheader"]) if smi else []
        except (childprocess.ChildFailed, OSError):
            lines = []
        if found_caps := capabilities(Nvml.load(), lines):
            result.append(f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(found_caps)}")
    return result
