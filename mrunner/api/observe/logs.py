"""``GET /logs[?source=MODEL|daemon][&follow=true]``: the daemon's log and every runner's, by source.

Lines read ``[source] text``, where the source is ``daemon`` or the runner
log's name (model and mode). ``source`` keeps one model's runners' logs (any
spelling of its name), or the daemon's. With ``follow=true`` the response
stays open and new lines are sent as the files grow, until the client hangs
up or the daemon stops, as fast as the client reads (L{mrunner.api.observe.follow}).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from klein import Klein
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.web.iweb import IRequest

from mrunner.api.documented import Documented, parameter
from mrunner.api.door.declared import Reach, Route, Who
from mrunner.api.errors import handle_json_errors
from mrunner.api.observe.follow import Feed, Followers, OpenFollows
from mrunner.api.observe.records import record_key
from mrunner.api.openapi import TEXT, Piece, answer, operation
from mrunner.api.reading.bodies import flag, query
from mrunner.config import Config
from mrunner.daemon.logfiles import DAEMON, LogTail
from mrunner.errors import NotFound
from mrunner.home import log_name

POLL_SECONDS = 0.25


class LogsAPI(Service):
    """The C{/logs} route; as a service it ends every open follow when the daemon stops."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)

    def __init__(self, directory: Path, clock: IReactorTime, followers: Followers | None = None) -> None:
        self._directory = directory
        self._clock = clock
        self._followers = Followers(Config()) if followers is None else followers
        self._follows = OpenFollows()

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/logs",
        "GET",
        operation(
            "The daemon's and runners' logs",
            {"200": answer("lines: [source] text", TEXT)},
            parameters=[
                parameter("source", "query", {"type": "string"}, "one model's runners' logs, or daemon"),
                parameter("follow", "query", {"type": "boolean"}, "keep sending lines as they are written"),
            ],
        ),
        door=Route(Who.ADMIN, Reach.UNDER),
    )
    def logs(self, request: IRequest) -> bytes | Deferred[bytes]:
        follow = flag(request, "follow")
        tail = LogTail(self._directory, sources=self._sources(query(request, "source")))
        feed = self._followers.open(request) if follow else None
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        if feed is None:
            return _lines(tail)
        return self._follow(request, tail, feed)

    def _sources(self, source: str | None) -> Callable[[str], bool]:
        """Which logs C{?source=} names: every log, the daemon's, or those of one model's runners."""
        if not source:
            return lambda name: True
        if source == DAEMON:
            return lambda name: name == DAEMON
        prefixes = tuple(f"{log_name(name)}-" for name in {source, record_key(source)})
        names = [path.stem for path in self._directory.glob("*.log")]
        if not any(name.startswith(prefixes) for name in names):
            known = ", ".join(sorted({DAEMON, *names}))
            raise NotFound(f"no log has the source {source!r}; sources: {known}", code="log_not_found")
        return lambda name: name.startswith(prefixes)

    def _follow(self, request: IRequest, tail: LogTail, feed: Feed) -> Deferred[bytes]:
        def poll() -> None:
            if not feed.paused:  # else the files keep what the client has yet to read
                feed.send(partial(_lines, tail))

        loop = LoopingCall(poll)
        loop.clock = self._clock

        def stop() -> None:
            loop.stop()
            feed.close()

        done = self._follows.hold(stop)
        request.write(b"")  # headers now: the client knows it is following
        loop.start(POLL_SECONDS)
        return done

    def stopService(self) -> None:
        super().stopService()
        self._follows.end()


def _lines(tail: LogTail) -> bytes:
    return "".join(f"[{source}] {line}\n" for source, line in tail.read()).encode()
