"""The pool of runner connections and the connections, over StringTransports: framing, reuse, resends."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers

from mrunner.errors import BadGateway
from mrunner.proxy.answer import Answer
from mrunner.proxy.pool import POOL_IDLE_SECONDS, RunnerPool
from mrunner.proxy.wire import ChunkedEnd
from tests.unit.proxy.fakes import CHUNKED_HEAD, CHUNKS, EVENTS, Connections, Recorder, lost


class PoolTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.connections = Connections()
        self.pool = RunnerPool(self.clock, self.connections, per_socket=2)

    def send(self, body: bytes = b"{}", reuse: bool = True) -> Deferred[Answer]:
        headers = Headers({b"X-A": [b"1"]})
        return self.pool.request(b"POST", "/run/r.sock", b"/v1/chat/completions", headers, body, reuse)

    def answer(self, response: bytes, framed: bool = True) -> Recorder:
        """Send a request, answer it with C{response} on the connection it went out on, relay the body."""
        sending = self.send()
        connection, _ = self.connections.made[-1]
        connection.dataReceived(response)
        self.assertIs(self.successResultOf(sending).connection, connection)
        body = Recorder()
        connection.relay(body, framed)
        return body

    def test_the_request_is_written_whole(self) -> None:
        self.send(b'{"a": 1}')
        ((connection, transport),) = self.connections.made
        self.assertEqual(connection.socket, "/run/r.sock")
        self.assertEqual(
            transport.value(),
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: runner\r\nContent-Length: 8\r\n"
            b'X-A: 1\r\n\r\n{"a": 1}',
        )

    def test_chunks_pass_through_as_they_are(self) -> None:
        body = self.answer(CHUNKED_HEAD + CHUNKS[:7])
        connection, _ = self.connections.made[-1]
        for i in range(7, len(CHUNKS), 5):
            self.assertFalse(body.ended)
            connection.dataReceived(CHUNKS[i : i + 5])
        self.assertEqual(b"".join(body.data), CHUNKS)
        self.assertTrue(body.ended)

    @given(st.lists(st.integers(min_value=1, max_value=len(CHUNKS) - 1), unique=True))
    def test_size_lines_and_the_end_go_on_whole(self, cuts: list[int]) -> None:
        """However the body is cut, a chunk-size line is passed on whole, and the end (C{0\\r\\n\\r\\n}, which
        llama-server writes in two) in one piece, with the event before it when that came with it."""
        body = self.answer(CHUNKED_HEAD)
        connection, _ = self.connections.made[-1]
        bounds = [0, *sorted(cuts), len(CHUNKS)]
        for a, b in itertools.pairwise(bounds):
            connection.dataReceived(CHUNKS[a:b])
        self.assertEqual(b"".join(body.data), CHUNKS)
        self.assertTrue(body.data[-1].endswith(b"0\r\n\r\n"))
        reader = ChunkedEnd()  # what a client reads, piece by piece: never inside a size line or the end
        held = [reader.feed(piece) < 0 and reader.held for piece in body.data]
        self.assertEqual(held, [0] * len(body.data))

    def test_chunks_lose_their_framing_for_a_client_without_it(self) -> None:
        body = self.answer(CHUNKED_HEAD + CHUNKS, framed=False)
        self.assertEqual(b"".join(body.data), b"".join(EVENTS))
        self.assertTrue(body.ended)

    def test_content_length(self) -> None:
        body = self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
        connection, _ = self.connections.made[-1]
        self.assertFalse(body.ended)
        connection.dataReceived(b"56789")
        self.assertEqual((b"".join(body.data), body.ended), (b"0123456789", True))

    def test_a_connection_is_reused_after_a_whole_answer(self) -> None:
        self.answer(CHUNKED_HEAD + CHUNKS)
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.clock.advance(POOL_IDLE_SECONDS - 0.1)
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.assertEqual(len(self.connections.made), 1)

    def test_a_connection_idle_too_long_is_not_reused(self) -> None:
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.clock.advance(POOL_IDLE_SECONDS)
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.assertEqual(len(self.connections.made), 2)
        self.assertTrue(self.connections.made[0][1].disconnecting)

    def test_the_connection_idle_longest_is_taken(self) -> None:
        self.send()
        self.send()
        for connection, _ in reversed(self.connections.made):  # the second answers first
            connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            connection.relay(Recorder(), True)
        self.clock.advance(1)
        self.send()
        self.assertEqual(len(self.connections.made), 2)
        requests = [transport.value().count(b"POST ") for _, transport in self.connections.made]
        self.assertEqual(requests, [1, 2])

    def test_connection_close_and_bytes_past_the_body_are_not_reused(self) -> None:
        self.answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}??")
        self.answer(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.assertEqual(len(self.connections.made), 3)
        self.assertTrue(all(transport.disconnecting for _, transport in self.connections.made))

    def test_a_body_to_the_close_ends_cleanly_at_the_close(self) -> None:
        body = self.answer(b"HTTP/1.1 200 OK\r\n\r\nsome")
        connection, _ = self.connections.made[-1]
        lost(connection)
        self.assertEqual((b"".join(body.data), body.ended, body.cut_because), (b"some", True, None))

    def test_a_request_on_a_pooled_connection_that_closes_unanswered_is_resent_on_a_new_one(self) -> None:
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        sending = self.send()
        first, _ = self.connections.made[0]
        self.assertEqual(len(self.connections.made), 1, "the pooled connection was used")
        lost(first)
        second, transport = self.connections.made[1]
        self.assertTrue(transport.value().startswith(b"POST /v1/chat/completions HTTP/1.1\r\n"))
        second.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.assertIs(self.successResultOf(sending).connection, second)

    def test_a_new_connection_that_closes_unanswered_is_a_bad_gateway(self) -> None:
        sending = self.send()
        lost(self.connections.made[0][0])
        error = self.failureResultOf(sending, BadGateway).value
        self.assertEqual(error.message, "the runner closed the connection before answering")
        self.assertEqual(len(self.connections.made), 1)

    def test_a_runner_that_refuses_is_a_bad_gateway_in_words(self) -> None:
        self.connections.refuse = True
        error = self.failureResultOf(self.send(), BadGateway).value
        self.assertEqual(error.message, "the runner cannot be reached: connection refused")

    def test_a_cut_between_chunks_and_inside_one(self) -> None:
        body = self.answer(CHUNKED_HEAD + CHUNKS[:16])  # the first chunk whole
        lost(self.connections.made[-1][0])
        self.assertEqual(body.cut_because, ("its connection closed", True))
        body = self.answer(CHUNKED_HEAD + CHUNKS[:10])
        lost(self.connections.made[-1][0])
        self.assertEqual(body.cut_because, ("its connection closed", False))

    def test_cancelling_while_waiting_for_the_head_aborts(self) -> None:
        sending = self.send()
        sending.cancel()
        connection, transport = self.connections.made[0]
        self.assertTrue(transport.disconnecting)
        lost(connection)  # no second result for the cancelled Deferred
        self.failureResultOf(sending)

    def test_an_interim_answer_is_skipped(self) -> None:
        body = self.answer(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.assertEqual(b"".join(body.data), b"{}")

    def test_a_garbled_head_is_a_bad_gateway(self) -> None:
        sending = self.send()
        self.connections.made[0][0].dataReceived(b"SSH-2.0-OpenSSH\r\n\r\n")
        self.assertIn("HTTP", self.failureResultOf(sending, BadGateway).value.message)

    def test_a_garbled_head_on_a_reused_connection_is_a_bad_gateway(self) -> None:
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        sending = self.send()
        self.connections.made[0][0].dataReceived(b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n")
        self.assertIn("no colon", self.failureResultOf(sending, BadGateway).value.message)

    def test_close_closes_idle_connections(self) -> None:
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        closing = self.pool.close()
        connection, transport = self.connections.made[0]
        self.assertTrue(transport.disconnecting)
        self.assertNoResult(closing)
        lost(connection)
        self.successResultOf(closing)

    def test_a_request_without_reuse_has_a_connection_of_its_own_closed_after_it(self) -> None:
        self.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        sending = self.send(reuse=False)
        self.assertEqual(len(self.connections.made), 2, "the idle connection is left for requests")
        connection, transport = self.connections.made[1]
        self.assertIn(b"\r\nConnection: close\r\n", transport.value())
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")  # keep-alive all the same
        self.successResultOf(sending).connection.relay(Recorder(), True)
        self.assertTrue(transport.disconnecting)
        self.send()
        self.assertEqual(len(self.connections.made), 2, "the idle connection served the next request")
