"""A runner's answer through a transform (L{Forwarder.forward}): read whole, as events, or relayed with
status and content type alone."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import BadGateway, CacheFull, ContextExceeded, MrunnerError
from mrunner.proxy.answer import Answer, RunnerRefused
from mrunner.proxy.forwarder import Forwarder, relayed
from mrunner.proxy.pool import RunnerPool
from tests.unit.proxy.fakes import CHUNKED_HEAD, CHUNKS, Connections, client_request, lost, runner_sends


def json_answer(status: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def error_event(error: MrunnerError) -> bytes:
    return b"event: error\ndata: " + error.message.encode() + b"\n\n"


CUT = "the runner stopped in the middle of the answer: its connection closed"


async def taken(answer: Answer) -> Answer:
    """The transform that hands the answer itself back, for the test to read."""
    return answer


async def collect(events: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event async for event in events]


class AnswerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.connections = Connections()
        self.forwarder = Forwarder(RunnerPool(Clock(), self.connections, per_socket=2), error_event)

    def post(self, *answer: bytes) -> Deferred[Answer]:
        request, _ = client_request()
        posting = Deferred.fromCoroutine(
            self.forwarder.forward(request, "/run/r.sock", b"/v1/chat/completions", b"{}", transform=taken)
        )
        runner, transport = self.connections.made[-1]
        self.assertIn(b"Content-Type: application/json\r\n", transport.value())
        for data in answer:
            runner.dataReceived(data)
        return posting

    def test_a_whole_json_answer(self) -> None:
        answer = self.successResultOf(self.post(json_answer(b"200 OK", b'{"a": 1}')))
        self.assertEqual(self.successResultOf(Deferred.fromCoroutine(answer.json())), {"a": 1})

    def test_the_runners_refusals(self) -> None:
        llama = json.dumps({"error": {"message": "bad", "type": "x"}}).encode()
        for status, body, code, message in [
            (b"400 Bad Request", llama, 400, "the runner refused the request: bad"),
            (b"501 Not Implemented", b"nope", 400, "the runner refused the request: nope"),
            (b"500 Internal Server Error", b"", 502, "the runner refused the request: status 500"),
        ]:
            error = self.failureResultOf(self.post(json_answer(status, body)), RunnerRefused).value
            self.assertEqual((error.status, error.message), (code, message))
        exceeded = {"error": {"type": "exceed_context_size_error", "n_prompt_tokens": 9, "n_ctx": 8}}
        self.failureResultOf(
            self.post(json_answer(b"400 Bad Request", json.dumps(exceeded).encode())), ContextExceeded
        )

    def test_a_refusal_keeps_the_runners_openai_code_and_param(self) -> None:
        """whisper-server's 400 for audio it cannot decode names its code and field, as mrunner's own do;
        llama-server's numeric code is not one."""
        said = {
            "message": "not audio",
            "type": "invalid_request_error",
            "param": "file",
            "code": "invalid_file",
        }
        whisper = json.dumps({"error": said}).encode()
        error = self.failureResultOf(self.post(json_answer(b"400 Bad Request", whisper)), RunnerRefused).value
        self.assertEqual((error.status, error.code, error.param), (400, "invalid_file", "file"))
        llama = b'{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}'
        error = self.failureResultOf(self.post(json_answer(b"400 Bad Request", llama)), RunnerRefused).value
        self.assertEqual((error.code, error.param), (None, None))

    def test_a_transform_sends_the_content_type_it_is_given(self) -> None:
        request, _ = client_request()
        form = b"multipart/form-data; boundary=b"
        Deferred.fromCoroutine(
            self.forwarder.forward(
                request, "/run/r.sock", b"/inference", b"--b--", transform=taken, content_type=form
            )
        )
        self.assertIn(b"Content-Type: " + form + b"\r\n", self.connections.made[-1][1].value())

    def test_a_full_cache_is_a_503_to_retry(self) -> None:
        """llama-server's 500 for a KV pool with no room (issue 49) never reaches a client as a 500,
        through a transform or passed through as OpenAI's."""
        full = b'{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}'
        answer = json_answer(b"500 Internal Server Error", full)
        error = self.failureResultOf(self.post(answer), CacheFull).value
        self.assertEqual((error.status, error.code, error.retry_after), (503, "runner_cache_full", 1.0))
        request, _ = client_request()
        passing = Deferred.fromCoroutine(
            self.forwarder.forward(request, "/run/r.sock", b"/v1/chat/completions", b"{}")
        )
        self.connections.made[-1][0].dataReceived(answer)
        self.failureResultOf(passing, CacheFull)
        self.assertFalse(request.startedWriting)

    def test_events_up_to_done(self) -> None:
        answer = self.successResultOf(self.post(CHUNKED_HEAD + chunk(b'data: {"a": 1}\n\n')))
        reading = Deferred.fromCoroutine(collect(answer.events()))
        self.assertNoResult(reading)
        self.connections.made[-1][0].dataReceived(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        self.assertEqual(self.successResultOf(reading), [{"a": 1}])

    def test_an_error_event_and_a_cut_are_errors(self) -> None:
        error = b'data: {"error": {"message": "oops"}}\n\n'
        answer = self.successResultOf(self.post(CHUNKED_HEAD + chunk(error)))
        self.failureResultOf(Deferred.fromCoroutine(collect(answer.events())), RunnerRefused)
        answer = self.successResultOf(self.post(CHUNKED_HEAD + CHUNKS[:10]))
        reading = Deferred.fromCoroutine(answer.read())
        lost(self.connections.made[-1][0])
        failure = self.failureResultOf(reading, BadGateway)
        self.assertEqual(failure.value.message, CUT)

    def test_cancelling_a_read_aborts_the_runner(self) -> None:
        answer = self.successResultOf(self.post(CHUNKED_HEAD))
        reading = Deferred.fromCoroutine(answer.read())
        reading.cancel()
        self.assertTrue(self.connections.made[-1][1].disconnecting)
        self.failureResultOf(reading, CancelledError)


class RelayTests(SynchronousTestCase):
    """L{relayed} (Anthropic's transform): the runner's status, content type and body; its error event on
    a cut."""

    def relay(self, *data: bytes, cut: bool = False) -> tuple[bytes, StringTransport]:
        connections = Connections()
        forwarder = Forwarder(RunnerPool(Clock(), connections, per_socket=2), error_event)
        request, transport = client_request()
        relay = relayed(request, error_event)
        relaying = Deferred.fromCoroutine(
            forwarder.forward(request, "/run/r.sock", b"/v1/messages", b"{}", transform=relay)
        )
        runner_sends(connections.made[0][0], data, cut)
        self.successResultOf(relaying)
        request.finish()
        return transport.value(), transport

    def test_status_content_type_and_body(self) -> None:
        data, _ = self.relay(json_answer(b"201 Made\r\nX-A: 1", b"{}"))
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 201 Created\r\n"))
        self.assertIn(b"\r\nContent-Type: application/json", head)
        self.assertNotIn(b"X-A", head)
        self.assertEqual(body, b"2\r\n{}\r\n0\r\n\r\n")

    def test_a_cut_ends_with_the_apis_error_event_whatever_the_body(self) -> None:
        short_json = json_answer(b"200 OK", b"{}").replace(b"Length: 2", b"Length: 9")
        for answer in (CHUNKED_HEAD + CHUNKS[:10], short_json):
            data, transport = self.relay(answer, cut=True)
            self.assertTrue(data.endswith(chunk(error_event(BadGateway(CUT))) + b"0\r\n\r\n"), data)
            self.assertFalse(transport.disconnecting)
