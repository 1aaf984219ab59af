"""Saved slot states on disk: each a state file and a small index entry beside it, bounded in size and age.

A state is written by llama-server as C{NAME.part}; only once its head has been
read back whole (L{read_tokens}) is it renamed C{NAME.bin} and its entry
C{NAME.json} written (to a temporary name, then renamed), so a file cut short by
a stop, a crash or a full disk is never found: a C{.part}, or a C{.bin} without
its entry, is removed when the store is opened. The entry says the KV layout the
state needs (L{layout}), the key that made it (its SHA-256; None without keys)
and the model file, and a fingerprint of the state file (L{fingerprint}), checked
before it is restored; the tokens are read from the state file's head. Least
recently used states go first when the disk budget is passed, and a state older
than the maximum age goes in any case.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
from twisted.logger import Logger

from mrunner.cache.statefile import CorruptState, fingerprint, read_tokens

PART, STATE, ENTRY = ".part", ".bin", ".json"


@attrs.define(eq=False)
class Saved:
    """One saved state: what it needs to be restored, and the exact tokens it holds."""

    name: str
    layout: str
    owner: str | None
    model: str
    tokens: bytes
    size: int
    used: float
    #: The model's name as its runner served it (C{--alias}).
    alias: str = ""
    #: The state file's L{fingerprint} when it was saved.
    fingerprint: str = ""

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // 4

    def entry(self) -> dict[str, object]:
        return {
            "layout": self.layout,
            "owner": self.owner,
            "model": self.model,
            "size": self.size,
            "alias": self.alias,
            "fingerprint": self.fingerprint,
        }


class SaveRefused(Exception):
    """A state was not kept: too short, unreadable, or no room for it."""


class CacheStore:
    """The folder of saved states, and their index in memory."""

    log = Logger()

    def __init__(
        self,
        folder: Path,
        max_bytes: int,
        max_age: float,
        now: Callable[[], float],
        min_tokens: int = 0,
        free: Callable[[Path], int] = lambda path: shutil.disk_usage(path).free,
        reserve: int = 1 << 30,
    ):
        self.folder = folder
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.min_tokens = min_tokens
        self._now = now
        self._free = free
        #: Bytes the disk keeps free: no save starts with less.
        self.reserve = reserve
        self.states: dict[str, Saved] = {}

    def open(self) -> None:
        """Create the folder (the owner's alone), read the entries, drop what is half-written."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for found in os.scandir(self.folder):
            path = Path(found.path)
            if found.is_dir(follow_symlinks=False):
                self.log.warn("prompt cache: {path} is a folder, not a saved state: left alone", path=path)
            elif path.suffix == PART or (path.suffix in (STATE, ENTRY) and path.stem not in self.states):
                self._read(path.stem)
        self.sweep()

    def _read(self, name: str) -> None:
        try:
            entry = json.loads(self._path(name, ENTRY).read_text())
            state = self._path(name, STATE)
            size = state.stat().st_size
            if size != entry["size"]:
                raise CorruptState(f"{name}: {size} bytes, its entry says {entry['size']}")
            used = state.stat().st_mtime
            tokens = read_tokens(state)
            layout, owner, model, mark = entry["layout"], entry["owner"], entry["model"], entry["fingerprint"]
            alias = entry.get("alias", "")
            self.states[name] = Saved(name, layout, owner, model, tokens, size, used, alias, mark)
        except (OSError, ValueError, KeyError, TypeError, CorruptState) as e:
            self.log.info("prompt cache: removed {name}, half-written or damaged: {why}", name=name, why=e)
            self._unlink(name)

    # Saving

    def room(self) -> bool:
        """Whether a save may start: the disk keeps its reserve free."""
        try:
            return self._free(self.folder) > self.reserve
        except OSError:
            return False

    def part_name(self) -> str:
        """A new file name for llama-server to save a slot as (C{NAME.part} in this folder)."""
        return uuid.uuid4().hex + PART

    def add(self, part: str, layout: str, owner: str | None, model: str, alias: str = "") -> Saved:
        """Keep the state llama-server wrote as C{part}; drop the states it supersedes, then the oldest
        beyond the budget.

        @raise SaveRefused: it holds fewer than C{min_tokens}, is not whole, or its entry could not be
            written (the disk is full); nothing of it is left.
        """
        name = part.removesuffix(PART)
        written = self.folder / part
        try:
            tokens = read_tokens(written)
            if len(tokens) // 4 < self.min_tokens:
                raise SaveRefused(f"{len(tokens) // 4} tokens, fewer than {self.min_tokens}")
            size = written.stat().st_size
            saved = Saved(name, layout, owner, model, tokens, size, self._now(), alias, fingerprint(written))
            _write_atomically(self._path(name, ENTRY), json.dumps(saved.entry()).encode())
            os.replace(written, self._path(name, STATE))
        except (OSError, CorruptState) as e:
            self._unlink(name)
            raise SaveRefused(str(e)) from e
        except SaveRefused:
            self._unlink(name)
            raise
        for old in list(self.states.values()):
            if old.layout == layout and old.owner == owner and tokens.startswith(old.tokens):
                self.remove(old)
        self.states[name] = saved
        self.sweep()
        return saved

    def discard(self, part: str) -> None:
        """A save that failed: its partial file goes."""
        self._unlink(part.removesuffix(PART))

    # Finding

    def candidates(self, layout: str, owner: str | None) -> bool:
        """Whether any state could serve a request of C{owner} on a runner of C{layout}."""
        return any(s.layout == layout and s.owner == owner for s in self.states.values())

    def best(self, layout: str, owner: str | None, tokens: bytes) -> Saved | None:
        """The state of C{layout} and C{owner} whose tokens are the longest exact prefix of C{tokens}."""
        found = None
        for saved in self.states.values():
            if saved.layout != layout or saved.owner != owner or not tokens.startswith(saved.tokens):
                continue
            if found is None or saved.n_tokens > found.n_tokens:
                found = saved
        return found

    def intact(self, saved: Saved) -> bool:
        """Whether C{saved}'s file is the one saved (its fingerprint), to be restored; else it is removed."""
        try:
            if fingerprint(self._path(saved.name, STATE)) == saved.fingerprint:
                return True
            why = "its file is not the one saved"
        except OSError as e:
            why = str(e)
        self.log.warn("prompt cache: removed {name}, not restored: {why}", name=saved.name, why=why)
        self.remove(saved)
        return False

    def used(self, saved: Saved) -> None:
        """C{saved} was restored: it is the most recently used (the state file's time says so on disk)."""
        saved.used = self._now()
        try:
            os.utime(self._path(saved.name, STATE), (saved.used, saved.used))
        except OSError:
            self.remove(saved)

    def state_name(self, saved: Saved) -> str:
        """The file name llama-server restores C{saved} from (in its C{--slot-save-path})."""
        return saved.name + STATE

    # Bounds

    def remove(self, saved: Saved) -> None:
        self.states.pop(saved.name, None)
        self._unlink(saved.name)

    def remove_where(self, match: Callable[[Saved], bool]) -> int:
        """Remove the states that C{match}; how many."""
        gone = [s for s in self.states.values() if match(s)]
        for saved in gone:
            self.remove(saved)
        return len(gone)

    def sweep(self) -> None:
        """Remove states older than the maximum age or of a model file gone, then the least recently
        used beyond the disk budget."""
        oldest = self._now() - self.max_age
        self.remove_where(lambda s: s.used < oldest or not os.path.exists(s.model))
        total = self.bytes
        for saved in sorted(self.states.values(), key=lambda s: s.used):
            if total <= self.max_bytes:
                break
            total -= saved.size
            self.remove(saved)

    def listing(self) -> list[dict[str, Any]]:
        """Each state kept, the most recently used first: its model, tokens, bytes, use, key."""
        self.sweep()
        return [
            {
                "model": s.alias,
                "tokens": s.n_tokens,
                "bytes": s.size,
                "last_used": datetime.fromtimestamp(s.used, UTC).isoformat(timespec="seconds"),
                "key": s.owner and s.owner[:12],
            }
            for s in sorted(self.states.values(), key=lambda s: -s.used)
        ]

    def clear(self, model: str | None = None) -> int:
        """Remove every state, or those of the model named C{model}; how many."""
        return self.remove_where(lambda s: model is None or s.alias == model)

    def usage(self) -> tuple[int, int]:
        """(files, bytes) of the states kept, once those of a model gone are removed."""
        self.sweep()
        return len(self.states), self.bytes

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.states.values())

    def _path(self, name: str, suffix: str) -> Path:
        return self.folder / (name + suffix)

    def _unlink(self, name: str) -> None:
        for suffix in (PART, STATE, ENTRY, ENTRY + PART):
            try:
                self._path(name, suffix).unlink(missing_ok=True)
            except OSError as e:  # a folder of that name, say: no reason not to start
                self.log.warn("prompt cache: {name} not removed: {why}", name=name + suffix, why=e)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write C{data} to C{path} whole or not at all: to C{path.part}, flushed, then renamed."""
    part = path.with_name(path.name + PART)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
    except OSError:
        part.unlink(missing_ok=True)
        raise
