"""The C parser's front door answers every request as twisted.web's parser does, byte for byte.

Each example is a stream of one or two requests (well formed, or bent in the ways
clients and attackers bend them), delivered in pieces cut at random; both sites
see the same stream, and their answers, what reached the routes, and whether they
closed must be the same. tests/unit/test_gate.py runs every door rule with each parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from mrunner.api.door.httptools_channel import HttptoolsChannel
from mrunner.api.door.site import GatedSite
from mrunner.config import Config, HTTPConfig

DATE = re.compile(rb"\r\nDate: [^\r]*")
LIMIT = 16384  # twisted.web's longest request line, and longest head


class Echo(Resource):
    """Answers with what the route saw: method, target, version, headers and body."""

    isLeaf = True

    def render(self, request: Any) -> bytes:
        seen = {
            "method": request.method.decode("latin-1"),
            "uri": request.uri.decode("latin-1"),
            "version": request.clientproto.decode("latin-1"),
            "headers": [
                [name.decode("latin-1"), [v.decode("latin-1") for v in values]]
                for name, values in request.requestHeaders.getAllRawHeaders()
            ],
            "body": request.content.read().decode("latin-1"),
        }
        return json.dumps(seen).encode()


class Transport(StringTransport):
    """A test transport that, as a TCP transport, may be paused after its connection was let go
    (twisted.web pauses reading when a client pipelines past a closing answer)."""

    def pauseProducing(self) -> None:
        self.producerState = "paused"


def serve(head_parser: str, pieces: list[bytes], api_keys: tuple[str, ...] = ()) -> tuple[bytes, bool]:
    """What the door writes back for C{pieces}, and whether it ended the connection."""
    config = attrs.evolve(
        Config(), max_request_bytes=1000, http=HTTPConfig(head_parser=head_parser, api_keys=api_keys)
    )
    site = GatedSite(Echo(), config, MemoryReactorClock())
    transport = Transport(
        hostAddress=IPv4Address("TCP", "127.0.0.1", 12434), peerAddress=IPv4Address("TCP", "127.0.0.1", 40000)
    )
    channel = site.buildProtocol(None)
    channel.makeConnection(transport)
    for piece in pieces:
        channel.dataReceived(piece)
    return DATE.sub(b"", transport.value()), transport.disconnecting


METHODS = st.sampled_from(
    [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"post", b"BREW", b"G\x01T"]
)
TARGETS = st.one_of(
    st.sampled_from(
        [
            b"/v1/chat/completions",
            b"/health",
            b"/v1/models?x=1",
            b"*",
            b"/a%20b",
            b"/\xa0",
            b"/a b",
            b"",
            b"/a#b",
        ]
    ),
    st.integers(LIMIT - 40, LIMIT + 4).map(lambda n: b"/" + b"a" * n),
    st.binary(max_size=8).map(lambda b: b"/" + b),
)
VERSIONS = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"http/1.1", b"HTTP/1.1 "])
NAMES = st.one_of(
    st.sampled_from(
        [
            *(b"Host", b"host", b"Content-Length", b"Transfer-Encoding", b"Origin", b"Authorization"),
            *(b"x-api-key", b"Connection", b"Expect", b"X-A", b"Host ", b" X-B", b"X\x00C", b""),
        ]
    ),
    st.binary(min_size=1, max_size=4),
)
VALUES = st.one_of(
    st.sampled_from(
        [
            *(b"127.0.0.1:12434", b"localhost", b"evil.example", b"5", b"0", b"-1", b"abc", b"9" * 25),
            *(
                b"chunked",
                b"Chunked",
                b"gzip, chunked",
                b"identity",
                b"close",
                b"keep-alive",
                b"100-continue",
            ),
            *(b"Bearer k", b" padded \t", b"a\x00b", b"\xff\xfe", b"a\nb", b"a\rb", b"http://localhost:3000"),
        ]
    ),
    st.integers(LIMIT - 60, LIMIT).map(lambda n: b"v" * n),
    st.binary(max_size=6),
)
ENDINGS = st.sampled_from([b"\r\n"] * 8 + [b"\n", b"\r\n "])


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method, target, version = draw(METHODS), draw(TARGETS), draw(VERSIONS)
    space = draw(st.sampled_from([b" "] * 6 + [b"  ", b"\t"]))
    lines = [method + space + target + b" " + version]
    if draw(st.booleans()):
        lines.append(b"Host: 127.0.0.1:12434")
    lines += [
        name + b":" + draw(st.sampled_from([b" ", b"", b"  ", b"\t"])) + draw(VALUES)
        for name in draw(st.lists(NAMES, max_size=4))
    ]
    head = b"".join(line + draw(ENDINGS) for line in lines)
    body = draw(st.one_of(st.just(b""), st.binary(max_size=12), st.just(b"5\r\nhello\r\n0\r\n\r\n")))
    extra = draw(st.sampled_from([b"", b"", b"\r\n", b"\r\n\r\n"]))
    return extra + head + b"\r\n" + body


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    data = b"".join(draw(st.lists(requests(), min_size=1, max_size=2)))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    return [data[start:end] for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True)]


class SameAnswerTests(SynchronousTestCase):
    @settings(max_examples=400)
    @given(streams(), st.booleans())
    def test_both_parsers_answer_alike(self, pieces: list[bytes], keys: bool) -> None:
        api_keys = ("k",) if keys else ()
        self.assertEqual(serve("httptools", pieces, api_keys), serve("twisted", pieces, api_keys), pieces)

    def test_a_pipelined_pair_split_anywhere(self) -> None:
        data = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
        )
        for cut in range(len(data) + 1):
            answer, closed = serve("httptools", [data[:cut], data[cut:]])
            self.assertEqual((answer, closed), serve("twisted", [data[:cut], data[cut:]]), cut)
            self.assertEqual(answer.count(b"HTTP/1.1 200 OK"), 2, cut)


class ParserChoiceTests(SynchronousTestCase):
    def test_httptools_reads_heads_unless_configured_otherwise(self) -> None:
        site = GatedSite(Echo(), Config(), MemoryReactorClock())
        self.assertIs(site.protocol, HttptoolsChannel)
        site.configure(attrs.evolve(Config(), http=HTTPConfig(head_parser="twisted")))
        self.assertNotIsInstance(site.buildProtocol(None), HttptoolsChannel)


class BareLineFeedTests(SynchronousTestCase):
    """Issue 35, A21: a head with a line ended by LF alone is a 400 at once, from either parser, however
    it is cut; twisted.web's parser waited for a CRLF until the connection's timeout."""

    GOOD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

    def test_refused_at_once(self) -> None:
        for name, data in {
            "every line": b"GET /health HTTP/1.1\nHost: 127.0.0.1\n\n",
            "the request line": b"GET /health HTTP/1.1\nHost: 127.0.0.1\r\n\r\n",
            "the blank line": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\n",
            "after a request served": self.GOOD + b"GET /health HTTP/1.1\nHost: 127.0.0.1\n\n",
        }.items():
            for parser in ("httptools", "twisted"):
                for cut in range(len(data) + 1):
                    with self.subTest(name, parser=parser, cut=cut):
                        answer, _ = serve(parser, [data[:cut], data[cut:]])
                        self.assertEqual(answer.count(b"HTTP/1.1 400 Bad Request"), 1)
                        self.assertIn(b'"code": "bare_lf"', answer)

    def test_crlf_cut_between_cr_and_lf_and_lfs_in_a_body_are_served(self) -> None:
        post = b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\na\nb\nc"
        for parser in ("httptools", "twisted"):
            for data in (self.GOOD, post, post + self.GOOD):
                for cut in range(len(data) + 1):
                    answer, _ = serve(parser, [data[:cut], data[cut:]])
                    self.assertNotIn(b"400", answer, (parser, data, cut))
