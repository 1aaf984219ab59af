"""Follow streams: their cap, and their pace set by the client (a recording fake request)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from treq import collect
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers

from mrunner.api.door.routing import Routes
from mrunner.api.observe.follow import MAX_HELD, Feed, Followers
from mrunner.api.observe.logs import LogsAPI
from mrunner.api.observe.records import Records
from mrunner.api.observe.records_api import RecordsAPI
from mrunner.config import Config, HTTPConfig
from mrunner.errors import TooManyRequests


class FakeTransport:
    aborted = False

    def abortConnection(self) -> None:
        self.aborted = True


class FakeRequest:
    """What a follow asks of its request: records writes and the producer it is given."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.producer: Any = None
        self.channel: object | None = object()
        self.transport = FakeTransport()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        assert self.producer is None and streaming
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None

    def write(self, data: bytes) -> None:
        self.written.append(data)


def config(**http: Any) -> Config:
    return attrs.evolve(Config(), http=HTTPConfig(**http))


class FeedTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.request = FakeRequest()
        self.closed: list[Feed] = []
        self.feed = Feed(self.request, self.closed.append, max_held=100)  # type: ignore[arg-type]

    def test_written_while_the_client_reads_and_held_while_it_does_not(self) -> None:
        self.assertIs(self.request.producer, self.feed)
        self.feed.send(lambda: b"one", 3)
        self.feed.pauseProducing()  # the client's socket takes no more
        made: list[str] = []
        self.feed.send(lambda: made.append("two") or b"two", 3)
        self.assertEqual((self.request.written, made), ([b"one"], []))  # not even made yet
        self.feed.resumeProducing()
        self.assertEqual(self.request.written, [b"one", b"two"])

    def test_a_follow_that_holds_past_its_bound_is_dropped(self) -> None:
        self.feed.pauseProducing()
        for _ in range(10):
            self.feed.send(lambda: b"x" * 10, 10)
        self.assertFalse(self.request.transport.aborted)
        self.feed.send(lambda: b"x", 1)
        self.assertTrue(self.request.transport.aborted)
        self.assertEqual((self.closed, self.request.producer), ([self.feed], None))
        self.feed.resumeProducing()
        self.assertEqual(self.request.written, [], "nothing held is written once dropped")

    def test_what_is_sent_at_once_does_not_count(self) -> None:
        self.feed.pauseProducing()
        for _ in range(1000):
            self.feed.send(lambda: b"a listing bounded by its limit")  # size 0
        self.assertFalse(self.request.transport.aborted)

    def test_close_once_the_client_is_gone(self) -> None:
        self.request.channel = None
        self.feed.stopProducing()
        self.feed.close()
        self.assertEqual(self.closed, [self.feed])

    def test_the_default_bound_is_a_few_mib(self) -> None:
        self.assertEqual(MAX_HELD, 4 * 1024 * 1024)


class FollowersTests(SynchronousTestCase):
    def test_the_cap_and_429_past_it(self) -> None:
        followers = Followers(config(max_followers=2))
        first = followers.open(FakeRequest())  # type: ignore[arg-type]
        followers.open(FakeRequest())  # type: ignore[arg-type]
        error = self.assertRaises(TooManyRequests, followers.open, FakeRequest())
        self.assertEqual((error.status, error.code), (429, "too_many_followers"))
        self.assertIn("max_followers", error.message)
        first.close()
        followers.open(FakeRequest())  # type: ignore[arg-type]
        self.assertEqual(len(followers), 2)

    def test_at_most_half_the_connections(self) -> None:
        self.assertEqual(Followers(config()).limit, 64)
        self.assertEqual(Followers(config(max_connections=10, max_followers=64)).limit, 5)
        self.assertEqual(Followers(config(max_connections=1)).limit, 1)
        followers = Followers(config(max_followers=3))
        followers.configure(config(max_followers=7))  # a reload
        self.assertEqual(followers.limit, 7)


class FollowRouteTests(SynchronousTestCase):
    """Both follow routes share the cap; the listing is bounded and paged."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.records = Records(per_model=2000, max_bytes=10**8, max_body=1000, now=self.clock.seconds)
        self.directory = directory = Path(self.mktemp())
        directory.mkdir()
        (directory / "daemon.log").write_text("started\n")
        self.followers = Followers(config(max_followers=2))
        self.history = RecordsAPI(self.records, self.followers)
        self.logs = LogsAPI(directory, self.clock, self.followers)
        self.http = StubTreq(Routes([self.history, self.logs]))

    def add(self, count: int) -> None:
        for _ in range(count):
            record = self.records.start(
                "ai/m:latest", "completion", b"POST", b"/v1/completions", Headers(), b"{}"
            )
            self.records.end(record, 200, completed=True)

    def get(self, url: str) -> tuple[int, Any]:
        response = self.successResultOf(self.http.get("http://mrunner" + url, unbuffered=True))
        return response.code, response

    def test_follows_past_the_cap_get_429_on_either_route(self) -> None:
        self.assertEqual(self.get("/logs?follow=true")[0], 200)
        self.assertEqual(self.get("/engines/requests?follow=true")[0], 200)
        for url in ("/logs?follow=true", "/engines/requests?follow=true"):
            code, response = self.get(url)
            self.assertEqual((code, response.phrase), (429, b"Too Many Requests"))
            body = json.loads(self.successResultOf(response.content()))
            self.assertEqual(body["error"]["code"], "too_many_followers")
        self.assertEqual(self.get("/logs")[0], 200, "a listing is no follow")
        self.history.stopService()
        self.logs.stopService()
        self.http.flush()
        self.assertEqual(len(self.followers), 0)
        self.assertEqual(self.get("/logs?follow=true")[0], 200)
        self.logs.stopService()

    def test_a_log_follow_reads_the_files_only_while_its_client_reads(self) -> None:
        _, response = self.get("/logs?follow=true")
        chunks: list[bytes] = []
        collect(response, chunks.append)
        self.http.flush()
        self.assertEqual(b"".join(chunks), b"[daemon] started\n")
        (feed,) = self.followers._open
        feed.pauseProducing()
        with (self.directory / "daemon.log").open("a") as log:
            log.write("later\n")
        self.clock.advance(5)
        self.http.flush()
        self.assertEqual(b"".join(chunks), b"[daemon] started\n")
        feed.resumeProducing()
        self.clock.advance(1)
        self.http.flush()
        self.assertEqual(b"".join(chunks), b"[daemon] started\n[daemon] later\n")
        self.logs.stopService()

    def test_a_listing_is_bounded_and_paged(self) -> None:
        self.add(1200)
        code, response = self.get("/engines/requests?follow=true&limit=100000")
        self.assertEqual(code, 400)
        message = json.loads(self.successResultOf(response.content()))["error"]["message"]
        self.assertIn("at most 1000", message)
        self.assertIn("before=", message)
        self.assertEqual(self.get("/engines/requests?limit=" + "9" * 5000)[0], 400)
        _, response = self.get("/engines/requests?limit=1000")
        page = json.loads(self.successResultOf(response.content()))
        self.assertEqual((page[0]["id"], page[-1]["id"]), (1200, 201))
        _, response = self.get(f"/engines/requests?limit=1000&before={page[-1]['id']}")
        rest = json.loads(self.successResultOf(response.content()))
        self.assertEqual([r["id"] for r in rest], list(range(200, 0, -1)))
        self.assertEqual(self.get("/engines/requests?before=0")[0], 400)
