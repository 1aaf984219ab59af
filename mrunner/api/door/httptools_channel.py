"""The front door's channel with each request's head read at once by httptools' C parser.

twisted.web reads a head a line at a time in Python: splitting the buffer,
then for each header splitting, checking and canonicalising its name, and
storing it; for the twenty-odd headers the openai client sends, about
80 µs of a request's CPU here. L{HttptoolsChannel} waits for the blank line that
ends the head, hands the whole head to httptools (uvicorn's parser), and fills
the same L{GatedRequest} twisted.web would, with the same checks after: the
trust rules, bodies, routes, answers and framing are L{GatedChannel}'s and
twisted.web's, unchanged.

A head that does not come whole in one read, or that httptools refuses or
reads otherwise than twisted.web would (a bare LF, which the twisted.web side
refuses, two spaces, HTTP/2.0, a size over the limits), is read by twisted.web's
own parser: a malformed or oversized request gets exactly the answer it got
before, and a trickled head the answer to each line as it comes.
tests/unit/test_httptools_channel.py checks that both parsers answer any stream of requests,
cut anywhere, alike.
"""

from __future__ import annotations

import httptools
from twisted.protocols.basic import LineReceiver

from mrunner.api.door.channel import GatedChannel
from mrunner.api.door.webprivate import canonical_name

END_OF_HEAD = b"\r\n\r\n"
TWISTED_VERSIONS = (b" HTTP/1.1", b" HTTP/1.0")


class Head:
    """What httptools' callbacks give for one request head: its target, and its headers stored as
    twisted.web's L{Headers} stores them (canonical names, values without their trailing blanks)."""

    __slots__ = ("count", "fields", "target")

    def __init__(self) -> None:
        self.target = b""
        self.fields: dict[bytes, list[bytes]] = {}
        self.count = 0

    def on_url(self, target: bytes) -> None:
        self.target += target

    def on_header(self, name: bytes, value: bytes) -> None:
        # httptools drops a value's leading blanks, and keeps its trailing ones.
        self.fields.setdefault(canonical_name(name), []).append(value.rstrip(b" \t"))
        self.count += 1


class HttptoolsChannel(GatedChannel):
    """A L{GatedChannel} whose request heads are parsed by httptools, each at once."""

    _twisted_heads = False  # twisted.web's parser is reading the pending head
    _pending = b""  # bytes not yet handled: a partial head, or data that came while handling
    _busy = False  # in _receive: bytes that arrive meanwhile (a replayed pipeline) wait in _pending

    def _receive(self, data: bytes) -> None:
        if self._twisted_heads:
            LineReceiver.dataReceived(self, data)
            self._refuse_bare_lf()
            return
        self._pending += data
        if self._busy:
            return
        self._busy = True
        try:
            while self._pending and not self.paused and not self._twisted_heads:
                if not self.line_mode:  # a body, or a next request while this one is handled
                    data, self._pending = self._pending, b""
                    self.rawDataReceived(data)
                elif not self._take_head() or self.transport.disconnecting:
                    break
        finally:
            self._busy = False
        if self._twisted_heads and self._pending:
            data, self._pending = self._pending, b""
            LineReceiver.dataReceived(self, data)
            self._refuse_bare_lf()

    def _take_head(self) -> bool:
        """Read the head at the start of C{_pending}, if all of it is there; whether one was read."""
        if not self.persistent:  # as twisted.web: what a client sends after its last request is dropped
            self._pending = b""
            return False
        pending = self._pending
        # A client may end a POST with one extra CRLF (twisted.web eats one, so this does too).
        start = 2 if pending.startswith(b"\r\n") else 0
        end = pending.find(END_OF_HEAD, start)
        if end < 0:  # a head in pieces: read by twisted.web, which answers each line as it comes
            self._read_by_twisted()
            return False
        head = Head()
        parser = httptools.HttpRequestParser(head)
        try:
            parser.feed_data(pending[start : end + 4])
        except httptools.HttpParserUpgrade:
            pass  # an Upgrade or CONNECT head is whole: answered as any other
        except httptools.HttpParserError:
            self._read_by_twisted()
            return False
        method, version = parser.get_method(), b"HTTP/" + parser.get_http_version().encode()
        if not self._fits(pending[start:end], method + b" " + head.target + b" " + version, head.count):
            self._read_by_twisted()
            return False
        self._pending = pending[end + 4 :]
        return self._headers_received(head, method, version)

    def _fits(self, head: bytes, request_line: bytes, count: int) -> bool:
        """Whether twisted.web's parser reads C{head} as httptools did, and takes it.

        The same request line (single spaces, HTTP/1.0 or 1.1, an ASCII target), one header a
        line with lines ended by CRLF only (httptools takes a bare LF too), and each line, all
        of them, and the count of headers within twisted.web's limits.
        """
        lines = head.count(b"\r\n")
        first = head[: head.find(b"\r\n")] if lines else head
        return (
            first == request_line
            and request_line.endswith(TWISTED_VERSIONS)
            and request_line.isascii()
            and lines == count <= self.maxHeaders
            and head.count(b"\n") == lines == head.count(b"\r")
            and len(first) <= self.MAX_LENGTH
            and len(head) - 2 * lines <= self.totalHeadersSize
        )

    def _headers_received(self, head: Head, method: bytes, version: bytes) -> bool:
        """Fill the request as twisted.web's line parser would, then go on as it does."""
        request = self.requestFactory(self, len(self.requests))
        self.requests.append(request)
        if not self.fill_head(request.requestHeaders, method, head.target, version, head.fields, head.count):
            return False  # answered 400 already
        self.allHeadersReceived()
        if self.length == 0:
            self.allContentReceived()
        else:
            self.setRawMode()
        return True

    def _read_by_twisted(self) -> None:
        """Hand the head now pending to twisted.web's parser."""
        self._twisted_heads = True

    def allHeadersReceived(self) -> None:
        self._twisted_heads = False  # the next head is httptools' again
        super().allHeadersReceived()
