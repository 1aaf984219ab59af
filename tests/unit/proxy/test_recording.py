"""What a request's record and a key's meter see of an answer, one way for every API (L{record_writes}).

The record sees each byte its client is sent, once, whether the forwarder wrote it
through C{request.write} or the relay sent it past it; the meter sees the runner's
answer, whether it is passed through, relayed or read by a transform.
"""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http import Request

from mrunner.errors import MrunnerError
from mrunner.proxy.answer import Answer
from mrunner.proxy.forwarder import Forwarder, Transform, relayed
from mrunner.proxy.pool import RunnerPool
from mrunner.proxy.relay import record_writes, recorder
from mrunner.proxy.rename import Renaming
from tests.unit.proxy.fakes import CHUNKED_HEAD, CHUNKS, EVENTS, Connections, client_request, runner_sends


def error_event(error: MrunnerError) -> bytes:
    return b"data: " + error.message.encode() + b"\n\n"


def json_answer(status: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % (status, len(body)) + body


class Seen:
    """An observer that keeps what it is shown (an L{mrunner.proxy.relay.Observer})."""

    def __init__(self) -> None:
        self.chunked: bool | None = None
        self.pieces: list[bytes] = []

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)

    def start(self, chunked: bool) -> None:
        self.chunked = chunked

    def write(self, data: bytes) -> None:
        self.pieces.append(data)


class RecordingTests(SynchronousTestCase):
    def forward(
        self,
        version: bytes,
        *data: bytes,
        renaming: Renaming | None = None,
        transform: Callable[[Request], Transform[object]] | None = None,
        cut: bool = False,
    ) -> tuple[Seen, Seen, bytes, Request]:
        """Forward a request whose runner sends C{data} (through the C{transform} made for the request):
        its record, its meter, the body its client got and the request."""
        connections = Connections()
        forwarder = Forwarder(RunnerPool(Clock(), connections, per_socket=2), error_event)
        request, client = client_request(version)
        record, meter = Seen(), Seen()
        record_writes(request, record)
        if transform is None:
            forwarding = forwarder.forward(request, "/run/r.sock", b"/v1/x", b"{}", meter, renaming)
        else:
            made = transform(request)
            forwarding = forwarder.forward(request, "/run/r.sock", b"/v1/x", b"{}", meter, transform=made)
        done = Deferred.fromCoroutine(forwarding)
        runner_sends(connections.made[0][0], data, cut)
        self.successResultOf(done)
        request.finish()
        return record, meter, client.value().partition(b"\r\n\r\n")[2], request

    def test_a_passed_through_stream_is_recorded_once_with_its_framing(self) -> None:
        """The chunks go past C{request.write}: the relay tells the record, which knows the framing."""
        record, meter, body, _ = self.forward(b"HTTP/1.1", CHUNKED_HEAD + CHUNKS[:20], CHUNKS[20:])
        self.assertEqual(body, CHUNKS)
        self.assertEqual((record.chunked, record.data), (True, CHUNKS))
        self.assertEqual(meter.data, CHUNKS)

    def test_a_renamed_answer_is_recorded_as_the_client_got_it(self) -> None:
        """Twisted frames a renamed answer: the record keeps its payload, renamed; the meter saw the same."""
        event = b'data: {"model":"runner"}\n\n'
        answer = CHUNKED_HEAD + b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event)
        record, meter, _, _ = self.forward(b"HTTP/1.1", answer, renaming=Renaming("runner", "asked"))
        self.assertEqual((record.chunked, record.data), (False, b'data: {"model":"asked"}\n\n'))
        self.assertEqual(meter.data, record.data)

    def test_a_refusal_passed_through_is_recorded_once(self) -> None:
        refusal = json.dumps({"error": {"message": "bad", "type": "invalid_request_error"}}).encode()
        record, meter, body, request = self.forward(b"HTTP/1.1", json_answer(b"400 Bad Request", refusal))
        self.assertEqual((request.code, body), (400, refusal))
        self.assertEqual((record.data, meter.data), (refusal, refusal))

    def test_a_relayed_answer_to_an_http10_client_is_recorded_whole(self) -> None:
        """Anthropic's relay: past the first piece, the relay sends to an HTTP/1.0 client directly; the
        record, which watched C{request.write} alone, kept the first piece only."""
        record, meter, body, _ = self.forward(
            b"HTTP/1.0",
            json_answer(b"200 OK", b'{"type": "message"}')[:-10],
            b'{"type": "message"}'[-10:],
            transform=lambda request: relayed(request, error_event),
        )
        self.assertEqual((body, record.data, meter.data), (b'{"type": "message"}',) * 3)

    def test_a_translated_answer_is_metered_from_the_runner_and_recorded_as_written(self) -> None:
        def translating(request: Request) -> Transform[None]:
            async def translate(answer: Answer) -> None:
                request.write(json.dumps({"translated": await answer.json()}).encode())

            return translate

        record, meter, body, _ = self.forward(
            b"HTTP/1.1", json_answer(b"200 OK", b'{"a": 1}'), transform=translating
        )
        self.assertEqual(meter.data, b'{"a": 1}')
        self.assertEqual(record.data, b'{"translated": {"a": 1}}')
        self.assertIn(record.data, body)

    def test_a_cut_stream_tells_the_record_its_error_event(self) -> None:
        """The error event is part of what the client got (to an HTTP/1.0 client, after the events)."""
        record, _, body, _ = self.forward(b"HTTP/1.0", CHUNKED_HEAD + CHUNKS[:20], cut=True)
        self.assertTrue(body.startswith(EVENTS[0]))
        self.assertEqual(record.data, body)

    def test_the_head_sent_alone_is_not_the_answers_first_byte(self) -> None:
        """A stream's head goes out at once (an empty write): the record's first byte (its C{ttfb}) is the
        first event's, whichever API relays it."""
        record, _, _, _ = self.forward(b"HTTP/1.1", CHUNKED_HEAD, CHUNKS)
        self.assertNotIn(b"", record.pieces)
        request, _ = client_request()
        record = Seen()
        record_writes(request, record)
        request.write(b"")
        self.assertEqual(record.pieces, [])

    def test_a_request_without_a_record_has_no_recorder(self) -> None:
        request, _ = client_request()
        self.assertIsNone(recorder(request))

    def test_a_recorded_request_is_freed_without_the_cyclic_collector(self) -> None:
        """Its recorder holds it weakly: a thousand finished streams do not wait for C{gc} to go."""
        request, client = client_request()
        record_writes(request, Seen())
        request.write(b"data")
        request.finish()
        gone = weakref.ref(request)
        gc.disable()
        self.addCleanup(gc.enable)
        del request, client
        self.assertIsNone(gone())
