"""``GET /logs[?follow=true]``: the daemon's log and every runner's, each line tagged with its source.

Lines read ``[source] text``, where the source is ``daemon`` or the runner
log's name (model and mode). With ``follow=true`` the response stays open
and new lines are sent as the files grow, until the client hangs up or the
daemon stops.
"""

from __future__ import annotations

from pathlib import Path

from klein import Klein
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.web.iweb import IRequest

from mrunner.api.errors import handle_json_errors
from mrunner.api.openapi import TEXT, Piece, answer, operation, parameter
from mrunner.api.requests import flag
from mrunner.logfiles import LogTail

POLL_SECONDS = 0.25


class LogsAPI(Service):
    """The C{/logs} route; as a service it ends every open follow when the daemon stops."""

    app = Klein()
    handle_json_errors(app)

    def __init__(self, directory: Path, clock: IReactorTime) -> None:
        self._directory = directory
        self._clock = clock
        self._follows: dict[Deferred[bytes], LoopingCall] = {}

    def openapi(self) -> Piece:
        follow = parameter("follow", "query", {"type": "boolean"}, "keep sending lines as they are written")
        lines = answer("lines: [source] text", TEXT)
        return {
            "paths": {
                "/logs": {
                    "get": operation("The daemon's and runners' logs", {"200": lines}, parameters=[follow])
                }
            }
        }

    @app.route("/logs", methods=["GET"])
    def logs(self, request: IRequest) -> bytes | Deferred[bytes]:
        follow = flag(request, "follow")
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        tail = LogTail(self._directory)
        _send(request, tail)
        if not follow:
            return b""
        request.write(b"")  # headers now: the client knows it is following
        return self._follow(request, tail)

    def _follow(self, request: IRequest, tail: LogTail) -> Deferred[bytes]:
        loop = LoopingCall(_send, request, tail)
        loop.clock = self._clock

        def hung_up(done: Deferred[bytes]) -> None:
            del self._follows[done]
            loop.stop()

        done: Deferred[bytes] = Deferred(canceller=hung_up)  # Klein cancels it when the client leaves
        self._follows[done] = loop
        loop.start(POLL_SECONDS, now=False)
        return done

    def stopService(self) -> None:
        super().stopService()
        follows, self._follows = self._follows, {}
        for done, loop in follows.items():
            loop.stop()
            done.callback(b"")


def _send(request: IRequest, tail: LogTail) -> None:
    lines = tail.read()
    if lines:
        request.write("".join(f"[{source}] {line}\n" for source, line in lines).encode())
