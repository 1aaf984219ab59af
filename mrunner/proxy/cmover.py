"""The fast relay's loop in C (C{mover.c}): built with the system's compiler once, loaded with ctypes.

A loop in Python, even one that releases the GIL in each system call, runs
Python for every event between them: the poll's list, the chunk-size line, a
C{bytes} for each read, the GIL taken back after each call (the bench measured
it at 1.1 to 1.9 times nginx's CPU an event, the C loop at 0.7 to 1.0). Here
the loop is a thread of C's own, which never takes the GIL, so a stream moves
on while the reactor holds it; a Python thread (L{CMover._run}) waits in C,
the GIL released, only for the streams Python must look at: a batch of bytes
for the observers, or a stream handed back. A property test holds it to the
Twisted relay byte for byte.

Why ctypes and a compiler at the first start rather than a C extension in the
package: mrunner installs from its source with no build step, the machines
that build llama-server have a compiler already, and where none is found the
daemon says so and keeps every stream on the Twisted relay. The shared object
is kept under the build cache, named by the source's digest, so an edit
builds a new one.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from functools import partial
from pathlib import Path
from typing import Any

from twisted.logger import Logger

from mrunner.backends.build import cache_root
from mrunner.proxy.fastrelay import FastRelay, Moved

SOURCE = Path(__file__).with_name("mover.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-pthread")
#: Streams one return from C may name.
NOTES = 256


log = Logger()


def fast_relay(reactor: Any, relay: str, cache: Path | None = None) -> FastRelay | None:
    """The relay C{[http] relay} names: the C loop (C{"fast"}, where it builds; else none, said in
    the log), or none (C{"twisted"}): without one every stream takes the Twisted relay."""
    if relay == "twisted":
        return None
    try:
        library = load(build(cache or cache_root({}, os.environ) / "native"))
    except (BuildFailed, OSError) as e:
        log.warn("the fast relay cannot be built, so every stream takes the Twisted relay: {why}", why=str(e))
        return None
    return FastRelay(reactor, partial(CMover, library))


class BuildFailed(Exception):
    """The C loop could not be built here; the message says why."""


def build(cache: Path, compiler: str | None = None) -> Path:
    """The shared object of L{SOURCE}: beside it where an image built it (C{python -m
    mrunner.proxy.cmover}), else under C{cache}, compiled first where it is not there yet."""
    source = SOURCE.read_bytes()
    name = f"mover-{hashlib.sha256(source + ' '.join(FLAGS).encode()).hexdigest()[:16]}.so"
    for target in (SOURCE.with_name(name), cache / name):
        if target.exists():
            return target
    compiler = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildFailed("no C compiler (cc or gcc) is on PATH")
    target = cache / name
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        done = subprocess.run(
            [compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildFailed(f"{compiler} did not run: {e}") from None
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildFailed(f"{compiler} failed: {done.stderr.strip()[-400:]}")
    os.replace(partial, target)  # whole, or not there: another daemon may be building it too
    return target


class Collected(ctypes.Structure):
    """C{struct collected}: what Python takes of a stream, its buffers then Python's to free."""

    _fields_ = [
        ("aside", ctypes.c_void_p),
        ("aside_len", ctypes.c_size_t),
        ("held", ctypes.c_void_p),
        ("held_len", ctypes.c_size_t),
        ("pending_from", ctypes.c_size_t),
        ("pending_to", ctypes.c_size_t),
        ("extra_from", ctypes.c_size_t),
        ("ended", ctypes.c_int),
        ("raw", ctypes.c_int),
        ("skip", ctypes.c_int64),
    ]


def load(path: Path) -> ctypes.CDLL:
    """The built loop, its functions typed."""
    library = ctypes.CDLL(str(path), use_errno=True)
    library.mover_new.restype = ctypes.c_void_p
    library.mover_add.restype = ctypes.c_int64
    library.mover_add.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    library.mover_start.argtypes = [ctypes.c_void_p]
    library.mover_wait.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
    for name in ("mover_collect", "mover_stop"):
        getattr(library, name).argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(Collected)]
    library.mover_free.argtypes = [ctypes.c_void_p]
    library.mover_free.restype = None
    return library


class CMover:
    """The thread's loop as L{FastRelay} asks it: C{add} a stream, C{take_back} one, and the C{lock}
    under which what it kept aside is taken."""

    def __init__(self, library: ctypes.CDLL, call_soon: Any, show: Any, back: Any) -> None:
        self._c = library
        self._call_soon = call_soon
        self._show = show
        self._back = back
        self._mover = library.mover_new()
        if not self._mover:
            raise OSError(ctypes.get_errno(), "the relay's epoll could not be made")
        self._keys: dict[int, Moved] = {}
        self._of: dict[Moved, int] = {}
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, moved: Moved) -> None:
        """Start moving C{moved} (from the reactor thread); its sockets' descriptors go to C."""
        if self._thread is None:
            error = self._c.mover_start(self._mover)
            if error:
                raise OSError(error, "the relay's thread could not start")
            self._thread = threading.Thread(target=self._run, name="mrunner-relay-c", daemon=True)
            self._thread.start()
        skip, _, _ = moved.chunks.state()  # between size lines: FastRelay takes no stream with bytes held
        with self.lock:
            key = self._c.mover_add(self._mover, moved.runner.fileno(), moved.client.fileno(), skip)
            if key < 0:
                raise OSError(ctypes.get_errno(), "the relay could not take the stream")
            moved.runner.detach()
            moved.client.detach()
            self._keys[key] = moved
            self._of[moved] = key

    def take_back(self, moved: Moved) -> bool:
        """Stop moving C{moved} now (from the reactor thread); False if it was handed back already."""
        with self.lock:
            key = self._of.get(moved)
            if key is None:
                return False
            out = Collected()
            if self._c.mover_stop(self._mover, key, ctypes.byref(out)) != 1:
                return False
            self._taken(moved, key, out, handed=True)
            return True

    def _run(self) -> None:
        keys = (ctypes.c_uint64 * NOTES)()
        wait, collect, mover = self._c.mover_wait, self._c.mover_collect, self._mover
        out = Collected()
        while True:
            noted = wait(mover, keys, NOTES)
            with self.lock:
                for key in keys[:noted]:
                    moved = self._keys.get(key)
                    if moved is None:
                        continue  # taken back since
                    handed = collect(mover, key, ctypes.byref(out))
                    if handed >= 0:
                        self._taken(moved, key, out, handed=bool(handed))
                        self._call_soon(self._back if handed else self._show, moved)

    def _taken(self, moved: Moved, key: int, out: Collected, handed: bool) -> None:
        """What C gave of C{moved}, into it: the bytes sent for the observers; handed back, the rest."""
        if out.aside_len:
            moved.aside.append(ctypes.string_at(out.aside, out.aside_len))
            moved.aside_size += out.aside_len
        self._c.mover_free(out.aside)
        if not handed:
            return
        held = ctypes.string_at(out.held, out.held_len) if out.held_len else b""
        self._c.mover_free(out.held)
        moved.chunks.restore((out.skip, b"", False))  # C keeps no cut line, nor a begun end
        moved.pending = held[out.pending_from : out.pending_to]
        moved.ended = bool(out.ended)
        if moved.ended:
            moved.extra = held[out.extra_from :]
        if out.raw:
            moved.raw = held
        moved.given_back = True
        del self._keys[key], self._of[moved]


# An image's build: the loop built beside its source, for a daemon with no compiler.
if __name__ == "__main__":
    print(build(SOURCE.parent))
