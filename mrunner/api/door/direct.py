"""The hot inference routes, called without Klein's URL matching.

Klein binds a werkzeug map and matches the path on every request: some 7% of
the daemon's CPU on small chats (py-spy). The paths of the inference routes
are fixed strings, so L{Routes} finds them in a dict (the routes declared hot,
L{mrunner.api.documented.Documented.direct}) and renders them with the group's
L{Direct}s, which do what Klein does with a route's result: write
bytes, finish the request, render an L{MrunnerError} in the route group's
error shape, and cancel the route when the client goes away.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from mrunner.api.errors import ErrorShape, internal_error, render_error
from mrunner.errors import MrunnerError

Handler = Callable[[Request], Any]


class Direct(Resource):
    """Renders one route's handler as its Klein route would, without matching the path."""

    isLeaf = True
    log = Logger()

    def __init__(self, handler: Handler, shape: ErrorShape):
        super().__init__()
        self._handler = handler
        self._shape = shape

    def render(self, request: Request) -> Any:
        finished = False
        done = request.notifyFinish()  # asked before the handler runs: it may finish the request
        d = maybeDeferred(self._handler, request)

        def ended(result: object) -> None:
            nonlocal finished
            finished = True
            if isinstance(result, Failure):  # the client went away: stop the route
                d.cancel()

        done.addBoth(ended)

        def failed(failure: Failure) -> bytes | None:
            if finished:  # nothing can be told to a client that is gone
                if not failure.check(CancelledError):
                    self.log.failure("a route failed after its answer ended", failure)
                return None
            error = failure.value if failure.check(MrunnerError) else internal_error(request, failure)
            return render_error(request, error, self._shape)  # type: ignore[arg-type]

        def answer(body: bytes | None) -> None:
            if body is not None:
                request.write(body)
            if not finished:
                request.finish()

        d.addErrback(failed).addCallback(answer)
        d.addErrback(lambda failure: self.log.failure("writing an answer failed", failure))
        return NOT_DONE_YET
