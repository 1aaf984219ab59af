"""Opening C{usage.sqlite}: owner-only, in WAL mode, with mrunner's table; a file that is not one moved aside.

A file of random bytes, a directory, or another program's database at that
path would otherwise end the start with a traceback. It is renamed to
C{usage.sqlite.damaged-<UTC time>} (its C{-wal} and C{-shm} beside it), named
in the log, and a fresh file started: the usage it held is not counted, and
nothing is deleted. What renaming cannot mend (no permission, a file another
process keeps locked, a full disk) is a L{UsageFileError} whose message says
what to do.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from twisted.logger import Logger

from mrunner.daemon.startup import StartupError
from mrunner.home import private_file

#: The columns of the table, in order: a table with others is another program's.
FIELDS = ("day", "key", "model", "requests", "prompt_tokens", "completion_tokens", "errors", "seconds")

_SCHEMA = """
CREATE TABLE usage (
    day TEXT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL,
    requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
    errors INTEGER NOT NULL, seconds REAL NOT NULL,
    PRIMARY KEY (day, key, model)
) WITHOUT ROWID
"""
#: Seconds a write waits for another process's lock before it fails (its rows then wait for the next).
BUSY_TIMEOUT = 5.0
# SQLite's primary result codes for a file that is not a database, or a damaged one.
_NOT_A_DATABASE = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_SIDE_FILES = ("-wal", "-shm")

log = Logger()


class UsageFileError(StartupError):
    """The usage file cannot be opened, and moving it aside would not help; the message says what to do.

    At start it ends the daemon with that one line, before it listens; later (the first named key
    comes with a reload) the rows wait, and the log says it.
    """


def open_usage(path: Path) -> sqlite3.Connection:
    """The connection to the usage file at C{path}, created if need be; a damaged file is moved aside first.

    @raise UsageFileError: the file cannot be opened or created (its message names it and what to do).
    """
    try:
        return _connect(path)
    except _Damaged as damage:
        aside = move_aside(path)
        log.warn(
            "{path} is not mrunner's usage file ({why}): moved to {aside}, and a fresh one started;"
            " the usage it held is not counted (today's token budgets start again from 0)",
            path=path,
            why=damage,
            aside=aside,
        )
    try:
        return _connect(path)
    except _Damaged as damage:  # it came back at once: something recreates it
        raise UsageFileError(f"{path} is still no usage file after it was moved aside ({damage})") from None


class _Damaged(Exception):
    """What is at the path is not mrunner's usage file."""


def _connect(path: Path) -> sqlite3.Connection:
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise _Damaged("not a regular file")
    try:
        private_file(path)
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT, check_same_thread=False, isolation_level=None)
    except (OSError, sqlite3.Error) as e:
        raise _failure(path, e) from None
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        _check_schema(db)
    except sqlite3.DatabaseError as e:
        db.close()
        if (getattr(e, "sqlite_errorcode", 0) & 0xFF) in _NOT_A_DATABASE:
            raise _Damaged(str(e)) from None
        raise _failure(path, e) from None
    except _Damaged:
        db.close()
        raise
    for suffix in _SIDE_FILES:  # SQLite gives them the file's mode; one left by an older mrunner may not be
        side = path.with_name(path.name + suffix)
        if side.is_file():
            side.chmod(0o600)
    return db


def _check_schema(db: sqlite3.Connection) -> None:
    """Create the table in an empty file; refuse a file whose schema is not exactly mrunner's: its one
    table, whose columns, types, NOT NULLs and primary key are those of L{_SCHEMA} (the daemon's
    upserts fail, every one, without that key), and nothing else (an index, a view, or a trigger,
    which could abort every write)."""
    found = list(db.execute("SELECT type, name FROM sqlite_schema"))
    if not found:
        db.execute(_SCHEMA)
        return
    if found != [("table", "usage")]:
        listed = ", ".join(sorted(f"{kind} {name}" for kind, name in found))[:200]
        raise _Damaged(f"another schema: {listed}")
    if _columns(db) != _made():
        raise _Damaged("another schema: the usage table's columns, types or primary key differ")


def _columns(db: sqlite3.Connection) -> list[tuple[object, ...]]:
    """The usage table's columns as C{PRAGMA table_info} tells them, its primary key among them."""
    return list(db.execute("PRAGMA table_info(usage)"))


@functools.cache
def _made() -> list[tuple[object, ...]]:
    """The columns of mrunner's table as SQLite makes it (L{_SCHEMA}): what a file's are compared with."""
    with closing(sqlite3.connect(":memory:")) as db:
        db.execute(_SCHEMA)
        return _columns(db)


def _failure(path: Path, error: Exception) -> UsageFileError:
    reason = getattr(error, "strerror", None) or error
    return UsageFileError(
        f"cannot open the usage file {path} ({reason}); make it a file this user can read and write"
        " (or move it away: a fresh one is started), or stop the program that holds it locked"
    )


def move_aside(path: Path) -> Path:
    """Rename C{path} (and its WAL and shared-memory files) to C{path.damaged-<UTC time>}; the new name."""
    stamp = f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    aside, n = path.with_name(stamp), 1
    while os.path.lexists(aside):
        n += 1
        aside = path.with_name(f"{stamp}-{n}")
    try:
        os.rename(path, aside)
        for suffix in _SIDE_FILES:
            side = path.with_name(path.name + suffix)
            if side.exists():
                os.rename(side, aside.with_name(aside.name + suffix))
    except OSError as e:
        raise UsageFileError(
            f"{path} is not a usage file and cannot be moved aside ({e.strerror}); move or remove it"
        ) from None
    return aside
