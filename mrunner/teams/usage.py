"""Usage per key, model and UTC day, in SQLite in the home: what quotas and reports read after a restart.

The reactor only adds to a dict; once a second the sums since the last write
go to the file in one transaction on a thread of their own (C{sqlite3} blocks),
so losing power loses at most the last second, and a daemon killed with
SIGKILL loses what it had not yet written, at most a second's worth. The file
is in WAL mode with C{synchronous=FULL}: a written second is on the disk, and
a reader (C{GET /engines/usage}) never waits for the writer.

A write that fails (another process holds the file locked, the disk is full)
puts its rows back: they wait for the next second's write, counted in
C{mrunner_usage_rows_waiting}, with a line in the log when they start waiting
and one when they are written. At most L{MAX_WAITING} rows wait; a row for a
new (day, key, model) past that is dropped, and counted. The file is kept only
while named keys are (C{[keys."NAME"]}): a daemon without them never opens it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from mrunner.config import Config
from mrunner.errors import MrunnerError
from mrunner.teams.usage_file import FIELDS, open_usage

FILE = "usage.sqlite"
#: Seconds between writes: the most a power cut loses.
FLUSH_EVERY = 1.0
#: The most rows (one per day, key and model) that wait while the file cannot be written.
MAX_WAITING = 10_000
_ADD = """
INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (day, key, model) DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    errors = errors + excluded.errors,
    seconds = seconds + excluded.seconds
"""
# Newest day first, then key and model: the order of a listing, and of ?after= (the last row seen).
_ORDER = " ORDER BY day DESC, key, model"
_AFTER = "(day < ? OR (day = ? AND (key, model) > (?, ?)))"

Where = tuple[str, str, str]


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

    def add(self, other: _Sums) -> None:
        for field in attrs.fields(_Sums):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


@attrs.frozen
class Query:
    """What C{GET /engines/usage} asks for; None: any."""

    key: str | None = None
    model: str | None = None
    since: str | None = None  # a day, inclusive
    until: str | None = None
    #: The (day, key, model) of the last row of the page before: the rows after it.
    after: Where | None = None
    limit: int = 1000


@attrs.frozen
class Page:
    rows: list[dict[str, Any]]
    #: Whether rows come after these: ask again with C{after} = the last one's (day, key, model).
    more: bool


class UsageBook:
    """The sums, on the reactor, and their file, written from one thread of its own.

    C{resolve} finds a model in the store by name (the store's C{resolve}); a request whose model it
    does not find leaves no row: a made-up name per request would otherwise grow the file for ever.
    """

    log = Logger()

    def __init__(
        self,
        home: Path,
        reactor: Any,
        now: Callable[[], float],
        resolve: Callable[[str], object] = str,
        keeping: bool = True,
    ):
        self._path = home / FILE
        self._reactor = reactor
        self._now = now
        self._resolve = resolve
        #: Whether usage is kept: the daemon's book only once its configuration names keys (L{configure}).
        self.keeping = keeping
        self._pending: dict[Where, _Sums] = {}
        #: Rows handed to the thread and not yet written.
        self._writing = 0
        #: Rows dropped because L{MAX_WAITING} were waiting already.
        self.dropped = 0
        self._failing = self._dropping = False
        #: Tokens each key used on C{_day}, read from the file when opened: daily budgets survive restarts.
        self._day = ""
        self._today: dict[str, int] = {}
        self._pool = ThreadPool(1, 1, "mrunner-usage")
        self._db: sqlite3.Connection | None = None

    @property
    def waiting(self) -> int:
        """Rows added and not yet in the file."""
        return len(self._pending) + self._writing

    def configure(self, config: Config) -> None:
        """Keep usage from now on when a reloaded C{config} names keys (and keep it when it names none).

        The file is then opened by the next write, on the book's thread, with today's totals read from
        it; at start L{open} does it, before the daemon serves.
        """
        self.keeping = self.keeping or bool(config.keys)

    def open(self) -> None:
        """Open (or create) the file and read today's totals, once; before the daemon serves, so it may
        block.

        @raise mrunner.teams.usage_file.UsageFileError: the file cannot be opened (the message says why).
        """
        if self._db is None:
            self._merge_today(self._open())

    def start(self) -> None:
        """Start the book's thread: writes and reads from now on."""
        self._pool.start()

    def _opened(self) -> sqlite3.Connection:
        """On the book's thread: the file, opened now if need be (today's totals then go to the reactor)."""
        if self._db is None:
            self._reactor.callFromThread(self._merge_today, self._open())
        assert self._db is not None
        return self._db

    def _open(self) -> tuple[str, dict[str, int]]:
        """The file opened, and its totals per key for today."""
        self._db = open_usage(self._path)
        day = utc_day(self._now())
        rows = self._db.execute(
            "SELECT key, SUM(prompt_tokens + completion_tokens) FROM usage WHERE day = ? GROUP BY key", (day,)
        )
        return day, {key: int(tokens) for key, tokens in rows}

    def _merge_today(self, read: tuple[str, dict[str, int]]) -> None:
        day, totals = read
        if day != self._day:
            self._day, self._today = day, {}
        for key, tokens in totals.items():
            self._today[key] = self._today.get(key, 0) + tokens

    def add(self, key: str, model: str, prompt: int, completion: int, error: bool, seconds: float) -> None:
        """Count one request of C{key} to C{model}, ended now (nothing when usage is not kept, or no
        stored model has that name)."""
        if not self.keeping or not self._stored(model):
            return
        day = utc_day(self._now())
        self._wait({(day, key, model): _Sums(1, prompt, completion, int(error), seconds)})
        if day != self._day:
            self._day, self._today = day, {}
        self._today[key] = self._today.get(key, 0) + prompt + completion

    def _stored(self, model: str) -> bool:
        try:
            self._resolve(model)
        except MrunnerError:  # not found, or not a name
            return False
        return True

    def _wait(self, rows: dict[Where, _Sums]) -> None:
        """Add C{rows} to those waiting for the next write; a new row past L{MAX_WAITING} is dropped."""
        for where, sums in rows.items():
            waiting = self._pending.get(where)
            if waiting is not None:
                waiting.add(sums)
            elif self.waiting < MAX_WAITING:
                self._pending[where] = sums
            else:
                self.dropped += 1
                if not self._dropping:
                    self._dropping = True
                    self.log.error(
                        "{count} usage rows wait for {file}: new rows are dropped (and counted in"
                        " mrunner_usage_rows_dropped_total) until it can be written",
                        count=self.waiting,
                        file=self._path,
                    )

    def used_today(self, key: str) -> int:
        """Tokens C{key} has used this UTC day (prompt and completion)."""
        return self._today.get(key, 0) if utc_day(self._now()) == self._day else 0

    def flush(self) -> Deferred[None]:
        """Write what was added since the last write, in one transaction on the book's thread.

        It never fails: rows that could not be written wait for the next flush.
        """
        if not self._pending:
            return succeed(None)
        pending, self._pending = self._pending, {}
        self._writing += len(pending)
        rows = [(*where, *attrs.astuple(sums)) for where, sums in pending.items()]
        d = deferToThreadPool(self._reactor, self._pool, self._write, rows)
        return d.addBoth(self._written, pending)

    def _write(self, rows: list[tuple[Any, ...]]) -> None:
        db = self._opened()
        with db:
            db.execute("BEGIN")
            db.executemany(_ADD, rows)

    def _written(self, result: Failure | None, rows: dict[Where, _Sums]) -> None:
        self._writing -= len(rows)
        if isinstance(result, Failure):
            self._wait(rows)
            if not self._failing:
                self._failing = True
                self.log.warn(
                    "usage not written to {file} ({why}): {count} rows wait, and each second tries again",
                    file=self._path,
                    why=result.getErrorMessage(),
                    count=self.waiting,
                )
            return
        if self._failing:
            self._failing = self._dropping = False
            self.log.info("usage written to {file} again", file=self._path)

    def query(self, query: Query) -> Deferred[Page]:
        """The page of rows C{query} selects, newest day first; what was added until now included."""
        self.flush()  # the one thread runs the write before the read
        return deferToThreadPool(self._reactor, self._pool, self._select, query)

    def _select(self, query: Query) -> Page:
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
        if query.after is not None:
            day, key, model = query.after
            where.append(_AFTER)
            values += [day, day, key, model]
        sql = "SELECT * FROM usage" + (" WHERE " + " AND ".join(where) if where else "")
        rows = self._opened().execute(sql + _ORDER + " LIMIT ?", [*values, query.limit + 1]).fetchall()
        page = [dict(zip(FIELDS, row, strict=True)) for row in rows[: query.limit]]
        return Page(page, more=len(rows) > query.limit)

    def close(self) -> Deferred[None]:
        """Write what is left, then close the file and stop the thread; rows that still cannot be
        written are named in the log, lost."""
        d = self.flush()

        def closed(result: object) -> object:
            if self._pending:
                self.log.error(
                    "{count} usage rows could not be written to {file} at stop, and are lost",
                    count=len(self._pending),
                    file=self._path,
                )
            self._pool.stop()
            if self._db is not None:
                self._db.close()
                self._db = None
            return result

        return d.addBoth(closed)


class UsageCollector(Collector):
    """The book's rows that wait to be written, and those dropped, as they are at scrape time."""

    def __init__(self, book: UsageBook):
        self._book = book

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            "mrunner_usage_rows_waiting",
            "Usage rows (day, key, model) added and not yet written to usage.sqlite.",
            value=self._book.waiting,
        )
        yield CounterMetricFamily(
            "mrunner_usage_rows_dropped",
            "Usage rows dropped because the most that may wait were waiting for usage.sqlite.",
            value=self._book.dropped,
        )


class UsageService(Service):
    """Opens the book before the daemon listens, writes it once a second, and writes the rest at stop."""

    def __init__(self, book: UsageBook, reactor: Any):
        self._book = book
        self._writes = LoopingCall(book.flush)
        self._writes.clock = reactor

    def privilegedStartService(self) -> None:
        """Open the file before the listener listens (a service later in the tree): a file that cannot be
        opened ends the start with one line, not a traceback from a daemon already serving."""
        super().privilegedStartService()
        self._open()

    def startService(self) -> None:
        super().startService()
        self._open()  # a tree started without twistd (tests) skips the privileged start
        self._book.start()
        self._writes.start(FLUSH_EVERY, now=False)

    def _open(self) -> None:
        if self._book.keeping:
            self._book.open()

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self._writes.running:
            self._writes.stop()
        return self._book.close()
