"""L{Direct}: a route rendered without Klein does with its result what Klein would."""

from __future__ import annotations

import json

from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import NOT_DONE_YET, Request
from twisted.web.test.requesthelper import DummyChannel

from mrunner.api.door.direct import Direct
from mrunner.api.errors import ErrorShape, ollama_shape, openai_shape
from mrunner.errors import NotFound


class DirectTests(SynchronousTestCase):
    def render(self, handler, shape: ErrorShape = openai_shape) -> Request:
        self.channel = DummyChannel()
        request = Request(self.channel)
        request.method, request.clientproto = b"POST", b"HTTP/1.1"
        self.assertIs(Direct(handler, shape).render(request), NOT_DONE_YET)
        return request

    def sent(self, request: Request) -> bytes:
        return self.channel.transport.written.getvalue()

    def test_bytes_are_written_and_the_request_finished(self) -> None:
        request = self.render(lambda request: succeed(b"answer"))
        self.assertTrue(request.finished)
        self.assertTrue(self.sent(request).endswith(b"answer\r\n0\r\n\r\n"))

    def test_a_route_that_answers_itself_is_finished_once(self) -> None:
        def handler(request: Request) -> None:
            request.write(b"streamed")
            request.finish()

        request = self.render(handler)
        self.assertTrue(request.finished)
        self.assertEqual(self.sent(request).count(b"0\r\n\r\n"), 1)

    def test_errors_in_the_apis_shape(self) -> None:
        request = self.render(lambda request: Deferred.fromCoroutine(_fails()))
        self.assertTrue(request.finished)
        self.assertTrue(self.sent(request).startswith(b"HTTP/1.1 404 "))
        body = json.loads(self.sent(request).split(b"\r\n\r\n", 1)[1].split(b"\r\n")[1])
        self.assertEqual(body["error"]["code"], "model_not_found")

    def test_errors_in_the_groups_own_shape(self) -> None:
        request = self.render(lambda request: Deferred.fromCoroutine(_fails()), ollama_shape)
        body = json.loads(self.sent(request).split(b"\r\n\r\n", 1)[1].split(b"\r\n")[1])
        self.assertEqual(body, {"error": "model ai/x not found"})

    def test_a_client_that_goes_away_cancels_the_route(self) -> None:
        cancelled = []
        request = self.render(lambda request: Deferred(cancelled.append))
        request.processingFailed = lambda failure: self.fail("nothing is written to a client that is gone")
        request.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(len(cancelled), 1)
        self.assertEqual((self.sent(request), request.finished), (b"", False))


async def _fails() -> bytes:
    raise NotFound("model ai/x not found", code="model_not_found")
