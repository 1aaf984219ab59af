"""Usage per key, model and UTC day, in SQLite in the home: what quotas and reports read after a restart.

The reactor only adds to a dict; once a second the sums since the last write
go to the file in one transaction on a thread of their own (C{sqlite3} blocks),
so losing power loses at most the last second, and a daemon killed with
SIGKILL loses what it had not yet written, at most a second's worth. The file
is in WAL mode with C{synchronous=FULL}: a written second is on the disk, and
a reader (C{GET /engines/usage}) never waits for the writer.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

FILE = "usage.sqlite"
#: Seconds between writes: the most a power cut loses.
FLUSH_EVERY = 1.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL,
    requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
    errors INTEGER NOT NULL, seconds REAL NOT NULL,
    PRIMARY KEY (day, key, model)
) WITHOUT ROWID
"""
_ADD = """
INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (day, key, model) DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    errors = errors + excluded.errors,
    seconds = seconds + excluded.seconds
"""
FIELDS = ("day", "key", "model", "requests", "prompt_tokens", "completion_tokens", "errors", "seconds")


def utc_day(when: float) -> str:
    """The UTC day of C{when} as C{YYYY-MM-DD}, the form the file and C{?from=&to=} use."""
    return time.strftime("%Y-%m-%d", time.gmtime(when))


@attrs.define
class _Sums:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    seconds: float = 0.0


@attrs.frozen
class Query:
    """What C{GET /engines/usage} asks for; None: any."""

    key: str | None = None
    model: str | None = None
    since: str | None = None  # a day, inclusive
    until: str | None = None


class UsageBook:
    """The sums, on the reactor, and their file, written from one thread of its own."""

    def __init__(self, home: Path, reactor: Any, now: Callable[[], float]):
        self._path = home / FILE
        self._reactor = reactor
        self._now = now
        self._pending: dict[tuple[str, str, str], _Sums] = {}
        #: Tokens each key used on C{_day}, read from the file at start: daily budgets survive restarts.
        self._day = ""
        self._today: dict[str, int] = {}
        self._pool = ThreadPool(1, 1, "mrunner-usage")
        self._db: sqlite3.Connection | None = None

    def open(self) -> None:
        """Open (or create) the file and read today's totals; before the daemon serves, so it may block."""
        self._db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)
        self._day = utc_day(self._now())
        rows = self._db.execute(
            "SELECT key, SUM(prompt_tokens + completion_tokens) FROM usage WHERE day = ? GROUP BY key",
            (self._day,),
        )
        self._today = {key: int(tokens) for key, tokens in rows}
        self._pool.start()

    def add(self, key: str, model: str, prompt: int, completion: int, error: bool, seconds: float) -> None:
        """Count one request of C{key} to C{model}, ended now."""
        day = utc_day(self._now())
        sums = self._pending.get((day, key, model))
        if sums is None:
            sums = self._pending[(day, key, model)] = _Sums()
        sums.requests += 1
        sums.prompt_tokens += prompt
        sums.completion_tokens += completion
        sums.errors += error
        sums.seconds += seconds
        if day != self._day:
            self._day, self._today = day, {}
        self._today[key] = self._today.get(key, 0) + prompt + completion

    def used_today(self, key: str) -> int:
        """Tokens C{key} has used this UTC day (prompt and completion)."""
        return self._today.get(key, 0) if utc_day(self._now()) == self._day else 0

    def flush(self) -> Deferred[None]:
        """Write what was added since the last write, in one transaction on the book's thread."""
        if not self._pending or self._db is None:
            return succeed(None)
        pending, self._pending = self._pending, {}
        rows = [(*where, *attrs.astuple(sums)) for where, sums in pending.items()]
        return deferToThreadPool(self._reactor, self._pool, self._write, rows)

    def _write(self, rows: list[tuple[Any, ...]]) -> None:
        assert self._db is not None
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(_ADD, rows)

    def query(self, query: Query) -> Deferred[list[dict[str, Any]]]:
        """The rows C{query} selects, by day, key and model; what was added until now included."""
        self.flush()  # the one thread runs the write before the read
        return deferToThreadPool(self._reactor, self._pool, self._select, query)

    def _select(self, query: Query) -> list[dict[str, Any]]:
        assert self._db is not None
        where, values = [], []
        for column, op, value in (
            ("key", "=", query.key),
            ("model", "=", query.model),
            ("day", ">=", query.since),
            ("day", "<=", query.until),
        ):
            if value is not None:
                where.append(f"{column} {op} ?")
                values.append(value)
        sql = "SELECT * FROM usage" + (" WHERE " + " AND ".join(where) if where else "")
        rows = self._db.execute(sql + " ORDER BY day, key, model", values)
        return [dict(zip(FIELDS, row, strict=True)) for row in rows]

    def close(self) -> Deferred[None]:
        """Write what is left, then close the file and stop the thread."""
        d = self.flush()

        def closed(result: object) -> object:
            self._pool.stop()
            if self._db is not None:
                self._db.close()
                self._db = None
            return result

        return d.addBoth(closed)


class UsageService(Service):
    """Opens the book at start, writes it once a second, and writes the rest at stop."""

    log = Logger()

    def __init__(self, book: UsageBook, reactor: Any):
        self._book = book
        self._writes = LoopingCall(self._write)
        self._writes.clock = reactor

    def _write(self) -> Deferred[None]:
        """One second's sums; a failed write (a full disk) is logged, and the next second tries again."""
        return self._book.flush().addErrback(
            lambda failure: self.log.failure("usage not written to {file}", failure, file=FILE)
        )

    def startService(self) -> None:
        super().startService()
        self._book.open()
        self._writes.start(FLUSH_EVERY, now=False)

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self._writes.running:
            self._writes.stop()
        return self._book.close()
