"""The usage store: rows kept while the file cannot be written, a damaged file moved aside, rows only for
stored models, paged reads, and owner-only files (issue 35 rows A5, A6, A7, A23; issue 36 row N6)."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import stat
from argparse import Namespace
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from rich.console import Console
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock, deferLater
from twisted.logger import LogEvent, capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase, TestCase

from mrunner import config as configuration
from mrunner.api.observe.usage_api import UsageAPI
from mrunner.cli import usage as usage_command
from mrunner.cli.context import Context
from mrunner.config import Config, ConfigError, KeyConfig
from mrunner.errors import NotFound
from mrunner.home import Home
from mrunner.teams import usage, usage_file
from mrunner.teams.limits import DAY
from mrunner.teams.usage import FILE, Page, Query, UsageBook, UsageCollector, UsageService, utc_day
from mrunner.teams.usage_file import UsageFileError

TODAY = 20000 * DAY + 10
STORED = {"ai/m:latest", "ai/n:latest"}


def resolve(name: str) -> str:
    """The store's C{resolve} as the book sees it: a name found, or L{NotFound}."""
    if name not in STORED:
        raise NotFound(f"model {name} not found")
    return name


def said(events: list[LogEvent]) -> str:
    return "\n".join(str(formatEvent(event)) for event in events)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def file_rows(path: Path) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute(
            "SELECT key, model, requests, prompt_tokens FROM usage ORDER BY key, model"
        ).fetchall()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Another process's write lock on the file, as `sqlite3 usage.sqlite 'BEGIN IMMEDIATE'` holds it."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


class BookTestCase(TestCase):
    def setUp(self) -> None:
        self.home = Path(self.mktemp())
        self.home.mkdir()
        self.clock = Clock()
        self.clock.advance(TODAY)
        self.patch(usage_file, "BUSY_TIMEOUT", 0.05)  # a locked write fails in 50 ms, not 5 s

    def book(self, **kw: Any) -> UsageBook:
        book = UsageBook(self.home, reactor, self.clock.seconds, **kw)
        book.open()
        book.start()
        return book


class UsageBookTests(BookTestCase):
    """The book's file, written on its thread: sums per day, key and model; read back after a restart."""

    async def test_sums_survive_a_restart(self) -> None:
        book = self.book()
        book.add("alice", "ai/m:latest", 10, 5, False, 1.5)
        book.add("alice", "ai/m:latest", 1, 2, True, 0.5)
        book.add("bob", "ai/n:latest", 3, 4, False, 1.0)
        await book.flush()
        self.clock.advance(DAY)
        book.add("alice", "ai/m:latest", 100, 0, False, 1.0)
        await book.close()

        again = self.book()
        self.addCleanup(again.close)
        self.assertEqual(again.used_today("alice"), 100)
        day = utc_day(20000 * DAY)
        page = await again.query(Query(key="alice", until=day))
        self.assertEqual(
            page.rows,
            [
                {
                    "day": day,
                    "key": "alice",
                    "model": "ai/m:latest",
                    "requests": 2,
                    "prompt_tokens": 11,
                    "completion_tokens": 7,
                    "errors": 1,
                    "seconds": 2.0,
                }
            ],
        )
        self.assertEqual(len((await again.query(Query())).rows), 3)
        self.assertEqual((await again.query(Query(model="ai/n:latest", since=utc_day(20001 * DAY)))).rows, [])
        journal = sqlite3.connect(self.home / FILE).execute("PRAGMA journal_mode").fetchone()[0]
        self.assertEqual(journal, "wal")

    async def test_written_each_second(self) -> None:
        """The service writes once a second: a second after a request, another reader of the file sees it."""
        book = UsageBook(self.home, reactor, self.clock.seconds)
        service = UsageService(book, self.clock)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        book.add("alice", "ai/m:latest", 1, 1, False, 0.1)
        self.clock.advance(1)
        for _ in range(500):  # the write runs on the book's thread
            rows = sqlite3.connect(self.home / FILE).execute("SELECT requests FROM usage").fetchall()
            if rows:
                break
            await deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(rows, [(1,)])


class WaitingRowsTests(BookTestCase):
    """A5: a write that fails puts its rows back; they are written once the file can be, and counted."""

    def metric(self, book: UsageBook, name: str) -> float | None:
        registry = CollectorRegistry()
        registry.register(UsageCollector(book))
        return registry.get_sample_value(name)

    async def test_locked_file_loses_no_row(self) -> None:
        """Five flushes while another process holds the write lock: all five rows wait, and are written
        (and so in today's budget after a restart) once the lock is gone."""
        book = self.book()
        with capturedLogs() as events, locked(self.home / FILE):
            for n in range(5):
                book.add("alice", "ai/m:latest", 10, 0, False, 0.1)
                await book.flush()
                self.assertEqual(book.waiting, 1, f"flush {n}")
            self.assertEqual(self.metric(book, "mrunner_usage_rows_waiting"), 1)
            self.assertEqual(file_rows(self.home / FILE), [])
        log = said(events)
        self.assertEqual(log.count("usage not written"), 1, "one line when rows start waiting: " + log)
        self.assertIn("database is locked", log)
        self.assertIn("1 rows wait", log)
        with capturedLogs() as events:
            await book.flush()
        self.assertIn("written to", said(events))
        self.assertEqual(book.waiting, 0)
        await book.close()
        self.assertEqual(file_rows(self.home / FILE), [("alice", "ai/m:latest", 5, 50)])
        again = self.book()
        self.addCleanup(again.close)
        self.assertEqual(again.used_today("alice"), 50)

    async def test_full_disk(self) -> None:
        """SQLITE_FULL (the file may grow no more, as on a full disk): the rows wait, then are written."""
        book = self.book()
        self.addCleanup(book.close)
        assert book._db is not None
        pages = book._db.execute("PRAGMA page_count").fetchone()[0]
        book._db.execute(f"PRAGMA max_page_count = {pages}")
        for n in range(300):  # far more bytes than the pages the file has
            book.add(f"key-{n:03d}-" + "k" * 50, "ai/m:latest", 1, 1, False, 0.1)
        with capturedLogs() as events:
            await book.flush()
        self.assertIn("full", said(events))
        self.assertEqual(book.waiting, 300)
        book._db.execute("PRAGMA max_page_count = 1073741823")
        await book.flush()
        self.assertEqual(book.waiting, 0)
        self.assertEqual(len(file_rows(self.home / FILE)), 300)

    async def test_bounded(self) -> None:
        """Past MAX_WAITING rows, a row for a new (day, key, model) is dropped and counted; one that waits
        already still adds up."""
        self.patch(usage, "MAX_WAITING", 2)
        book = self.book()
        self.addCleanup(book.close)
        with capturedLogs() as events, locked(self.home / FILE):
            book.add("alice", "ai/m:latest", 1, 0, False, 0.1)
            book.add("bob", "ai/m:latest", 1, 0, False, 0.1)
            await book.flush()
            book.add("carol", "ai/m:latest", 1, 0, False, 0.1)
            book.add("dave", "ai/m:latest", 1, 0, False, 0.1)
            book.add("alice", "ai/m:latest", 1, 0, False, 0.1)
            await book.flush()
        self.assertEqual((book.waiting, book.dropped), (2, 2))
        self.assertEqual(self.metric(book, "mrunner_usage_rows_dropped_total"), 2)
        self.assertEqual(said(events).count("new rows are dropped"), 1)
        await book.flush()
        self.assertEqual(
            file_rows(self.home / FILE), [("alice", "ai/m:latest", 2, 2), ("bob", "ai/m:latest", 1, 1)]
        )

    async def test_lost_at_stop_is_said(self) -> None:
        book = self.book()
        book.add("alice", "ai/m:latest", 1, 0, False, 0.1)
        with capturedLogs() as events, locked(self.home / FILE):
            await book.close()
        self.assertIn("1 usage rows could not be written", said(events))


#: mrunner's columns, as another program could declare them.
COLUMNS = (
    "day TEXT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, requests INTEGER NOT NULL,"
    " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, errors INTEGER NOT NULL,"
    " seconds REAL NOT NULL"
)


class DamagedFileTests(BookTestCase):
    """A6: what is at usage.sqlite and is not mrunner's usage file is moved aside, and a fresh one started."""

    def opened_after(self, make: Any) -> tuple[Path, str]:
        make(self.home / FILE)
        with capturedLogs() as events:
            book = self.book()
        self.addCleanup(book.close)
        book.add("alice", "ai/m:latest", 1, 0, False, 0.1)
        asides = list(self.home.glob(FILE + ".damaged-*"))
        self.assertEqual(len(asides), 1, list(self.home.iterdir()))
        log = said(events)
        self.assertIn(str(asides[0]), log, "the log names where it went")
        return asides[0], log

    async def assert_fresh(self) -> None:
        await self.book().close()
        self.assertEqual(file_rows(self.home / FILE), [])

    async def test_random_bytes(self) -> None:
        junk = os.urandom(8192)
        aside, log = self.opened_after(lambda path: path.write_bytes(junk))
        self.assertEqual(aside.read_bytes(), junk, "moved, not changed")
        self.assertIn("not a database", log)

    def test_a_directory(self) -> None:
        aside, _ = self.opened_after(lambda path: (path.mkdir(), (path / "inside").write_text("x")))
        self.assertEqual((aside / "inside").read_text(), "x")
        self.assertTrue((self.home / FILE).is_file())

    def test_another_schema(self) -> None:
        def other(path: Path) -> None:
            with closing(sqlite3.connect(path)) as db:
                db.execute("CREATE TABLE usage (day TEXT, tokens INTEGER)")
                db.execute("INSERT INTO usage VALUES ('2026-01-01', 5)")
                db.commit()

        aside, log = self.opened_after(other)
        self.assertIn("another schema", log)
        with closing(sqlite3.connect(aside)) as db:
            self.assertEqual(db.execute("SELECT * FROM usage").fetchall(), [("2026-01-01", 5)])

    def assert_refused(self, *statements: str) -> None:
        """A file made by C{statements} is moved aside as another schema's."""

        def other(path: Path) -> None:
            with closing(sqlite3.connect(path)) as db:
                for statement in statements:
                    db.execute(statement)

        self.assertIn("another schema", self.opened_after(other)[1])

    def test_mrunners_columns_without_its_primary_key(self) -> None:
        """Accepted before (issue 53 L5): every write then failed, and the usage was lost at restart."""
        self.assert_refused(f"CREATE TABLE usage ({COLUMNS})")

    def test_mrunners_table_with_a_trigger(self) -> None:
        self.assert_refused(
            f"CREATE TABLE usage ({COLUMNS}, PRIMARY KEY (day, key, model)) WITHOUT ROWID",
            "CREATE TRIGGER no BEFORE INSERT ON usage BEGIN SELECT RAISE(ABORT, 'no'); END",
        )

    def test_another_programs_database(self) -> None:
        def other(path: Path) -> None:
            with closing(sqlite3.connect(path)) as db:
                db.execute("CREATE TABLE bookmarks (url TEXT)")

        self.opened_after(other)

    def test_what_renaming_cannot_mend_is_one_line(self) -> None:
        """A home that is gone: L{UsageFileError}, a StartupError (twistd prints it as one line)."""
        book = UsageBook(self.home / "gone", reactor, self.clock.seconds)
        with self.assertRaises(UsageFileError) as caught:
            book.open()
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        self.assertIn(str(self.home / "gone" / FILE), message)
        self.assertIn("make it a file this user can read and write", message)

    async def test_no_named_keys_never_opens_it(self) -> None:
        """A daemon without named keys keeps no usage: a damaged file beside it is left as it is."""
        (self.home / FILE).write_bytes(b"junk")
        book = UsageBook(self.home, reactor, self.clock.seconds, keeping=False)
        service = UsageService(book, self.clock)
        service.privilegedStartService()
        service.startService()
        book.add("anonymous", "ai/m:latest", 1, 1, False, 0.1)
        self.assertEqual(book.waiting, 0)
        await service.stopService()
        self.assertEqual((self.home / FILE).read_bytes(), b"junk")
        self.assertEqual(list(self.home.glob("*.damaged-*")), [])

    async def test_a_reload_that_names_keys_opens_it(self) -> None:
        book = UsageBook(self.home, reactor, self.clock.seconds, keeping=False)
        book.start()
        self.addCleanup(book.close)
        book.configure(Config(keys={"alice": KeyConfig(key="k")}))
        book.add("alice", "ai/m:latest", 3, 4, False, 0.1)
        await book.flush()
        self.assertEqual(file_rows(self.home / FILE), [("alice", "ai/m:latest", 1, 3)])
        book.configure(Config())
        self.assertTrue(book.keeping, "a reload without keys keeps what it keeps")


class StoredModelsTests(BookTestCase):
    """A7: a request whose model the store does not have leaves no row."""

    async def test_made_up_models_leave_no_row(self) -> None:
        book = self.book(resolve=resolve)
        for n in range(100):
            book.add("alice", f"ai/missing-{n}:latest", 0, 0, True, 0.01)
        book.add("alice", "ai/m:latest", 2, 3, False, 0.5)
        self.assertEqual(book.waiting, 1)
        await book.close()
        self.assertEqual(file_rows(self.home / FILE), [("alice", "ai/m:latest", 1, 2)])


class PagingTests(BookTestCase):
    async def test_pages_newest_day_first(self) -> None:
        book = self.book()
        self.addCleanup(book.close)
        for _ in range(3):
            for key in ("bob", "alice"):
                book.add(key, "ai/m:latest", 1, 0, False, 0.1)
            self.clock.advance(DAY)
        seen: list[tuple[str, str]] = []
        after = None
        while True:
            page = await book.query(Query(limit=4, after=after))
            seen += [(row["day"], row["key"]) for row in page.rows]
            if not page.more:
                break
            last = page.rows[-1]
            after = (last["day"], last["key"], last["model"])
        days = [utc_day(TODAY + n * DAY) for n in (2, 1, 0)]
        self.assertEqual(seen, [(day, key) for day in days for key in ("alice", "bob")])
        self.assertEqual(len((await book.query(Query(limit=6))).rows), 6)
        self.assertFalse((await book.query(Query(limit=6))).more)


class FakeBook:
    """The usage book as the route sees it: the queries asked, a page of C{rows} answered."""

    keeping = True

    def __init__(self, rows: list[dict[str, Any]], more: bool = False) -> None:
        self.asked: list[Query] = []
        self._page = Page(rows, more)

    def query(self, query: Query) -> Deferred[Page]:
        self.asked.append(query)
        return succeed(self._page)


ROW = {"day": "2026-03-02", "key": "alice", "model": "ai/m:latest", "requests": 1}


class UsageRouteTests(SynchronousTestCase):
    """C{GET /engines/usage}: paged and bounded (A7); a day that is no day is a 400 naming it (N6)."""

    def get(self, book: Any, query: str) -> tuple[int, Any]:
        http = StubTreq(UsageAPI(book).app.resource())
        response = self.successResultOf(http.get("http://d/engines/usage" + query))
        return response.code, json.loads(self.successResultOf(response.content()))

    def test_paged(self) -> None:
        book = FakeBook([ROW], more=True)
        code, body = self.get(book, "?limit=1&after=2026-03-03/bob/hf.co/org/repo:Q4")
        self.assertEqual(code, 200)
        self.assertEqual(
            body, {"object": "list", "data": [ROW], "has_more": True, "next": "2026-03-02/alice/ai/m:latest"}
        )
        self.assertEqual(
            (book.asked[0].limit, book.asked[0].after), (1, ("2026-03-03", "bob", "hf.co/org/repo:Q4"))
        )
        code, body = self.get(FakeBook([ROW]), "")
        self.assertEqual((body["has_more"], body["next"]), (False, None))

    def test_bounded(self) -> None:
        book = FakeBook([])
        self.get(book, "")
        self.assertEqual(book.asked[0].limit, 100)
        code, body = self.get(book, "?limit=1001")
        self.assertEqual(code, 400)
        self.assertIn("1000", body["error"]["message"])

    def test_bad_days_and_cursors(self) -> None:
        for query, named in (
            ("?from=2026-13-01", "2026-13-01"),
            ("?to=2026-02-30", "2026-02-30"),
            ("?from=yesterday", "yesterday"),
            ("?after=2026-03-02/alice", "2026-03-02/alice"),
            ("?after=someday/alice/ai/m", "someday/alice/ai/m"),
            ("?after=" + "2026-03-02/a/" + "m" * 2000, "2026-03-02/a/m"),
        ):
            code, body = self.get(FakeBook([]), query)
            self.assertEqual(code, 400, query)
            self.assertIn(named, body["error"]["message"])

    def test_not_kept_without_named_keys(self) -> None:
        book = FakeBook([])
        book.keeping = False
        code, body = self.get(book, "")
        self.assertEqual((code, body["error"]["code"]), (404, "usage_off"))
        self.assertIn('[keys."NAME"]', body["error"]["message"])


class FakeDaemon:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.paths: list[str] = []
        self._pages = pages

    def call(self, method: str, path: str) -> Any:
        self.paths.append(path)
        return self._pages[len(self.paths) - 1]


class UsageCommandTests(SynchronousTestCase):
    def test_reads_every_page(self) -> None:
        daemon = FakeDaemon(
            [{"data": [ROW], "next": "2026-03-02/alice/ai/m:latest"}, {"data": [ROW], "next": None}]
        )
        out = io.StringIO()
        ctx = Context(lambda: daemon, Console(file=out), Console(file=io.StringIO()))  # type: ignore[arg-type,return-value]
        args = Namespace(key=None, model=None, since="2026-03-01", until=None, json=True)
        usage_command.usage(ctx, args)
        self.assertEqual(json.loads(out.getvalue()), {"object": "list", "data": [ROW, ROW]})
        self.assertEqual(
            daemon.paths,
            [
                "/engines/usage?from=2026-03-01&limit=1000",
                "/engines/usage?from=2026-03-01&limit=1000&after=2026-03-02%2Falice%2Fai%2Fm%3Alatest",
            ],
        )


class PrivateFilesTests(SynchronousTestCase):
    """A23: the usage file, a home made beforehand, a key file others can read."""

    def setUp(self) -> None:
        self.patch(usage_file, "BUSY_TIMEOUT", 0.05)
        old = os.umask(0o022)
        self.addCleanup(os.umask, old)

    def test_usage_file_owner_only(self) -> None:
        home = Path(self.mktemp())
        home.mkdir()
        (home / FILE).touch(0o644)  # as an older mrunner left it
        (home / FILE).chmod(0o644)
        book = UsageBook(home, reactor, Clock().seconds)
        book.open()
        self.addCleanup(book.close)
        self.assertEqual(mode(home / FILE), 0o600)
        for side in ("-wal", "-shm"):
            self.assertEqual(mode(home / (FILE + side)), 0o600, side)
        fresh = Path(self.mktemp())
        fresh.mkdir()
        made = UsageBook(fresh, reactor, Clock().seconds)
        made.open()
        self.addCleanup(made.close)
        self.assertEqual(mode(fresh / FILE), 0o600)

    def test_a_home_made_beforehand_is_made_owner_only(self) -> None:
        root = Path(self.mktemp())
        root.mkdir(mode=0o755)
        root.chmod(0o755)
        with capturedLogs() as events:
            Home(root).prepare()
            Home(root).prepare()
        self.assertEqual(mode(root), 0o700)
        log = said(events)
        self.assertEqual(log.count("had mode 0755: made 0700"), 1, log)

    def key_file(self, file_mode: int) -> Config:
        secret = Path(self.mktemp())
        secret.write_text("alice-key\n")
        secret.chmod(file_mode)
        conf = Path(self.mktemp())
        conf.write_text(f'[keys.alice]\nkey_file = "{secret}"\n')
        return configuration.load(conf, environ={})

    def test_key_file_others_can_read_is_refused(self) -> None:
        for file_mode in (0o644, 0o604, 0o602):
            with self.assertRaises(ConfigError) as caught:
                self.key_file(file_mode)
            message = str(caught.exception)
            self.assertIn(f"{file_mode:04o}", message)
            self.assertIn("chmod 600", message)
            self.assertNotIn("alice-key", message)
        for file_mode in (0o600, 0o640, 0o400):
            self.assertEqual(self.key_file(file_mode).keys["alice"].key, "alice-key")
