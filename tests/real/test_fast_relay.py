"""The fast relay's thread (its loop in C, L{mrunner.proxy.cmover.CMover}) against the Twisted relay,
on real sockets.

Real sockets and a real thread, so it lives apart from the unit tests. Each
example is a runner's chunked answer sent in pieces cut anywhere, with pauses
anywhere, a client that reads at once or only at the end (its socket is small,
so the thread finds it full), and a runner that ends the body or closes in the
middle. The thread moves what it can, then hands the stream back, and the
Twisted path goes on from there as L{FastRelay} does; what the client gets,
and how the answer ends, must be exactly what the Twisted relay alone makes of
the same pieces.
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import threading
import time
from functools import partial
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends.build import cache_root
from mrunner.proxy.cmover import CMover, build, load
from mrunner.proxy.connection import RunnerConnection
from mrunner.proxy.fastrelay import Moved, duplicate, show_aside
from mrunner.proxy.pool import RunnerPool
from mrunner.proxy.wire import Malformed
from tests.unit.proxy.fakes import CHUNKED_HEAD, Connections, Recorder, lost

SMALL_BUFFER = 4096
SECONDS = 10.0

#: Events of any bytes, some longer than the client's socket holds.
payloads = st.lists(
    st.tuples(st.integers(1, 3 * SMALL_BUFFER), st.binary(min_size=1, max_size=8)).map(
        lambda size_and_bytes: (size_and_bytes[1] * size_and_bytes[0])[: size_and_bytes[0]]
    ),
    max_size=6,
)


def chunked(pieces: list[bytes], trailer: bool) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return body + (b"0\r\nX-T: 1\r\n\r\n" if trailer else b"0\r\n\r\n")


def cuts(data: bytes, at: list[int]) -> list[bytes]:
    """C{data} cut at the offsets C{at} (taken modulo its length)."""
    points = sorted({0, len(data), *(a % (len(data) + 1) for a in at)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def answering() -> tuple[RunnerConnection, Recorder]:
    """A runner connection whose chunked answer's head is in, its body relayed with its framing."""
    connection = RunnerConnection(RunnerPool(Clock(), Connections(), 2), "/run/r.sock")
    connection.makeConnection(StringTransport())
    connection.send(b"POST", b"request")
    connection.dataReceived(CHUNKED_HEAD)
    body = Recorder()
    connection.relay(body, framed=True)
    return connection, body


Ending = tuple[bytes, bool, "tuple[str, bool] | None", bool]


def received(connection: RunnerConnection, piece: bytes) -> bool:
    """C{piece} given to the connection as the reactor would; False where it was found malformed (the
    reactor then drops the connection)."""
    try:
        connection.dataReceived(piece)
    except Malformed:
        return False
    return True


def twisted_alone(pieces: list[bytes], cut: bool) -> Ending:
    connection, body = answering()
    for piece in pieces:
        if connection.relaying is not None and not received(connection, piece):
            return b"".join(body.data), body.ended, body.cut_because, True
    if cut and connection.relaying is not None:
        lost(connection)
    return b"".join(body.data), body.ended, body.cut_because, False


def read_all(sock: socket.socket) -> bytes:
    got = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return b"".join(got)
        if not data:
            return b"".join(got)
        got.append(data)


class Reactor:
    """The reactor thread's side of the mover: what it is called to do, run by the test."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[Any, tuple[Any, ...]]] = queue.Queue()

    def call_soon(self, f: Any, *args: Any) -> None:
        self.calls.put((f, args))


def fast(
    pieces: list[bytes], cut: bool, pauses: list[float], reads_at_once: bool, loop: Any
) -> tuple[Ending, bytes, bytes]:
    """What the client gets through the mover, then Twisted; and what the observers and client saw."""
    connection, body = answering()
    runner_far, runner_near = socket.socketpair()
    client_near, client_far = socket.socketpair()
    client_near.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
    client_far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
    for sock in (runner_near, client_near, client_far):
        sock.setblocking(False)
    reactor = Reactor()
    observed: list[bytes] = []

    class Seen:
        def write(self, data: bytes) -> None:
            observed.append(data)

    back: list[Moved] = []
    mover = loop(reactor.call_soon, lambda m: show_aside(m, mover.lock, [Seen()]), back.append)
    moved = Moved(duplicate(runner_near), duplicate(client_near), connection.chunks)  # type: ignore[arg-type]
    mover.add(moved)

    def runner() -> None:
        for piece, pause in zip(pieces, pauses + [0.0] * len(pieces), strict=False):
            runner_far.sendall(piece)
            time.sleep(pause)
        if cut:
            runner_far.close()

    writing = threading.Thread(target=runner)
    writing.start()
    client_got = []
    deadline = time.monotonic() + SECONDS
    while not back:
        if reads_at_once:
            client_got.append(read_all(client_far))
        try:
            f, args = reactor.calls.get(timeout=0.001)
            f(*args)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise AssertionError("the mover never handed the stream back") from None
    writing.join()
    show_aside(moved, mover.lock, [Seen()])
    client_got.append(read_all(client_far))
    # The Twisted relay goes on, as FastRelay._back does.
    if moved.pending:
        body.write(moved.pending)
    malformed = False
    if moved.ended:
        connection.ended_elsewhere(moved.extra)
    else:
        rest = moved.raw + read_all(runner_near)  # what the reactor reads once it reads again
        malformed = bool(rest) and not received(connection, rest)
        if cut and connection.relaying is not None and not malformed:
            lost(connection)
    sent = b"".join(client_got)
    for sock in (runner_far, runner_near, client_near, client_far):
        sock.close()
    return (sent + b"".join(body.data), body.ended, body.cut_because, malformed), b"".join(observed), sent


class CLoopTests(SynchronousTestCase):
    """The thread's loop in C (C{[http] relay = "fast"}), held to the Twisted relay's bytes and ends."""

    loop = partial(CMover, load(build(cache_root({}, os.environ) / "native")))

    @settings(max_examples=60, deadline=None)
    @example([b"data: x\n\n"], False, 18, [], [], False, b"", b"zz\r\n")  # cut just after the bad line
    @given(
        payloads,
        st.booleans(),
        st.integers(min_value=0, max_value=10**6),
        st.lists(st.integers(min_value=0, max_value=10**6), max_size=8),
        st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.005]), max_size=8),
        st.booleans(),
        st.binary(max_size=20),
        st.sampled_from([b"", b"", b"", b"zz\r\n", b"5\r\nhello\r\nq"]),
    )
    def test_the_client_gets_exactly_what_the_twisted_relay_sends(
        self,
        events: list[bytes],
        trailer: bool,
        cut_at: int,
        cut_points: list[int],
        pauses: list[float],
        reads_at_once: bool,
        after: bytes,
        garbage: bytes,
    ) -> None:
        """Also where the runner's bytes go wrong midway (C{garbage}: a size line that is not hex)."""
        whole = chunked(events, trailer)
        if garbage:
            whole = whole[: -len(b"0\r\n\r\n")] + garbage + b"0\r\n\r\n"
        cut = cut_at % 3 == 0  # a third of the runners close mid-body
        data = whole[: cut_at % len(whole)] if cut else whole + after
        pieces = cuts(data, cut_points)
        expected = twisted_alone(pieces, cut)
        ending, observed, sent = fast(pieces, cut, pauses, reads_at_once, self.loop)
        if expected[3]:
            # Malformed: either relay sends the reads before the one that completes the bad line, and
            # how the runner's bytes fell into reads is the kernel's, so only a prefix can be compared.
            # The bad line ends at the garbage's own CRLF (b"zz\r\n"), or at the next one (b"...q").
            bad_line_read = data.index(b"\r\n", data.index(garbage) + len(garbage.rstrip(b"\r\n"))) + 2
            self.assertEqual(ending[1:], expected[1:])
            self.assertTrue(data.startswith(ending[0]) and len(ending[0]) < bad_line_read, ending)
        else:
            self.assertEqual(ending, expected)
        self.assertEqual(observed, sent, "the observers see the bytes the thread sent, as they went")
