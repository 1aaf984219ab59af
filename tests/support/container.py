"""The mrunner image (./Containerfile), built with podman once per machine and reused, for the tests.

No base image can be pulled here, so the base is a root filesystem that Debian's C{mmdebstrap}
builds from Debian's packages (the host's apt sources on bookworm), imported into podman once.
The Python packages come from a wheelhouse that pip downloads on the host (once per set of
dependencies), llama-server from the machine's own build (C{make backend}); both are mounted into
the build, which runs with C{--network=none}. Podman's layer cache redoes only the steps after the
copy of the source when mrunner changes (a minute or so), nothing when it has not.

Everything lives in a podman storage of its own under the machine's cache, with the settings a
root-in-a-VM sandbox needs (each found by an error without it):
  - overlay storage where the kernel allows it, else vfs, which copies every layer whole (a first
    build took 6 minutes on vfs here);
  - the cgroupfs manager, no systemd;
  - runc: crun refuses the host's hybrid cgroups ("cgroups in hybrid mode not supported, drop
    all controllers from cgroupv2");
  - rlimits no higher than 4096: root here lacks CAP_SYS_RESOURCE, and podman's defaults fail
    ("crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted", runc: "error setting rlimits").
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from mrunner.backends.build import cache_root
from mrunner.backends.llamacpp.source import cached_executable

ROOT = Path(__file__).parents[2]
#: The base's Debian release, and the CPython its wheels are for (bookworm's python3).
SUITE, PYTHON = "bookworm", "3.11"
#: What the Containerfile's stages need, so that its apt-get never runs.
PACKAGES = ("python3", "python3-venv", "ca-certificates", "libgomp1", "libssl3")
#: manylinux tags a wheel for bookworm's glibc (2.36) may carry.
MANYLINUX = tuple(f"manylinux_2_{minor}_x86_64" for minor in (5, 12, 17, 24, 27, 28, 31, 34, 35, 36))
LIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
#: Debian's packages of the same names.
TOOLS = ("podman", "runc", "mmdebstrap")


def skip_reason() -> str | None:
    """Why the image cannot be built on this machine, or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install {' '.join(missing)} (make system-deps)"
    if not cached_executable().is_file():
        return f"llama-server is not built at {cached_executable()}: run `make backend`"
    info = run([*_podman("vfs"), "info"], 120, check=False)
    if info.returncode != 0:  # a machine whose kernel or sandbox runs no container at all
        return f"podman cannot run here: {(info.stdout + info.stderr).strip()[-400:]}"
    return None


def cache() -> Path:
    """The machine's container cache, beside its llama-server build."""
    return cache_root({}, os.environ) / "container"


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    """C{podman} on the cache's own storage, with this sandbox's settings; its error in the exception."""
    return run([*_podman(_driver()), *args], timeout, check)


def _podman(driver: str) -> list[str]:
    where = cache()
    return [
        *("podman", "--root", str(where / f"storage-{driver}"), "--runroot", str(where / f"run-{driver}")),
        *("--storage-driver", driver, "--cgroup-manager", "cgroupfs", "--events-backend", "file"),
        *("--runtime", "runc"),
    ]


@functools.cache
def _driver() -> str:
    """overlay when podman can mount it here (it checks at start), else vfs."""
    return "overlay" if run([*_podman("overlay"), "info"], 120, check=False).returncode == 0 else "vfs"


def run(command: list[str], timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    """C{command}'s result; unless it succeeds (with C{check}), an error that quotes its output."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{output}")
    return done


def image() -> str:
    """The image of this checkout's source, built (or found in podman's cache): its tag."""
    with _locked():
        base = _base_image()
        wheels = _wheelhouse()
        tag = f"localhost/mrunner:test-{_digest(str(ROOT))}"  # each checkout's own
        podman(
            *("build", "--network=none", *LIMITS, "--build-arg", f"BASE={base}"),
            *(
                "--build-arg",
                "LLAMA_SERVER=/prebuilt/llama-server",
                "-v",
                f"{cached_executable().parent}:/prebuilt:ro",
            ),
            *("--build-arg", "PIP_OPTIONS=--no-index --find-links=/wheels", "-v", f"{wheels}:/wheels:ro"),
            *("-t", tag, "-f", str(ROOT / "Containerfile"), str(ROOT)),
            timeout=3600,
        )
        return tag


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One build at a time on this machine (parallel trial workers, two checkouts)."""
    cache().mkdir(parents=True, exist_ok=True)
    with open(cache() / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _base_image() -> str:
    """Debian with L{PACKAGES}, from mmdebstrap, imported once; its tag names what it holds."""
    tag = f"localhost/mrunner-base:{SUITE}-{_digest(SUITE, *PACKAGES)}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    rootfs = cache() / "rootfs.tar"
    # The host's own apt sources when they are for the same release (its mirror, its snapshot).
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    mirror = [str(sources)] if SUITE in _read(sources) else []
    run(
        ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), *mirror],
        3600,
    )
    try:
        podman("import", str(rootfs), tag, timeout=1800)
    finally:
        rootfs.unlink()
    return tag


def _wheelhouse() -> Path:
    """mrunner's dependencies as wheels for L{PYTHON} on Debian, downloaded once per set of them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = sorted([*project["project"]["dependencies"], *project["build-system"]["requires"]])
    wheels = cache() / f"wheels-{PYTHON}-{_digest(*wanted)}"
    if wheels.is_dir():
        return wheels
    partial = wheels.with_name(wheels.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    run(
        [
            *(sys.executable, "-m", "pip", "download", "-q", "-d", str(partial), "--only-binary=:all:"),
            *("--python-version", PYTHON, "--implementation", "cp"),
            *("--abi", f"cp{PYTHON.replace('.', '')}", "--abi", "abi3", "--abi", "none"),
            *(option for tag in MANYLINUX for option in ("--platform", tag)),
            *wanted,
        ],
        1800,
    )
    partial.rename(wheels)
    return wheels


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
