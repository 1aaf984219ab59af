"""A runner's HTTP/1.1 on the wire: where a chunked body ends, however it is cut; the answer's head."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from mrunner.proxy.wire import CHUNKED, CLOSE, EMPTY, LENGTH, ChunkedEnd, Head, Malformed
from tests.unit.proxy.fakes import CHUNKS, EVENTS


class ChunkedEndTests(SynchronousTestCase):
    @given(st.lists(st.integers(min_value=1, max_value=len(CHUNKS) - 1), unique=True))
    def test_the_end_is_found_however_the_body_is_cut(self, cuts: list[int]) -> None:
        """The body ends at its last byte whatever reads it came in, and the payload is the events."""
        scanner, payload = ChunkedEnd(), []
        bounds = [0, *sorted(cuts), len(CHUNKS)]
        ends = [
            scanner.feed(CHUNKS[a:b] + (b"x" if b == len(CHUNKS) else b""), payload)
            for a, b in itertools.pairwise(bounds)
        ]
        self.assertEqual(ends[:-1], [-1] * (len(ends) - 1))
        self.assertEqual(ends[-1], len(CHUNKS) - bounds[-2])
        self.assertEqual(b"".join(payload), b"".join(EVENTS))

    def test_extensions_and_trailers(self) -> None:
        body = b"3;name=value\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"
        self.assertEqual(ChunkedEnd().feed(body), len(body))

    def test_sizes_that_are_not_hexadecimal(self) -> None:
        for size in (b"-1", b"+1", b"0x1", b"1_0", b"zz", b""):
            self.assertRaises(Malformed, ChunkedEnd().feed, size + b"\r\n")


class HeadTests(SynchronousTestCase):
    def test_framing(self) -> None:
        cases = [
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", b"POST", CHUNKED, True),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2", b"POST", LENGTH, True),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 0", b"POST", EMPTY, True),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2", b"HEAD", EMPTY, True),
            (b"HTTP/1.1 204 No Content", b"POST", EMPTY, True),
            (b"HTTP/1.1 200 OK", b"POST", CLOSE, False),
            (b"HTTP/1.0 200 OK\r\nContent-Length: 2", b"POST", LENGTH, False),
            (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2", b"POST", LENGTH, True),
            (b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 2", b"POST", LENGTH, False),
        ]
        for data, method, framing, keep_alive in cases:
            head = Head(data, method)
            self.assertEqual((head.framing, head.keep_alive), (framing, keep_alive), data)

    def test_fields_keep_their_case_and_order(self) -> None:
        head = Head(b"HTTP/1.1 404 Not Found\r\nX-A: 1\r\nx-a: 2, 3\r\nContent-Type: text/plain", b"GET")
        self.assertEqual((head.code, head.phrase), (404, b"Not Found"))
        self.assertEqual(head.value(b"x-a"), b"1")
        self.assertEqual(head.tokens(b"x-a"), {b"1", b"2", b"3"})
        self.assertEqual([name for _, name, _ in head.fields], [b"X-A", b"x-a", b"Content-Type"])

    def test_what_is_not_http(self) -> None:
        for data in (b"SSH-2.0-OpenSSH", b"HTTP/2 200", b"HTTP/1.1 2x0 OK", b"HTTP/1.1 200 OK\r\nno colon"):
            self.assertRaises(Malformed, Head, data, b"GET")
        self.assertRaises(Malformed, Head, b"HTTP/1.1 200 OK\r\nContent-Length: -1", b"GET")
