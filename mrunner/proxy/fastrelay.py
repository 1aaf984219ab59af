"""The pass-through relay's fast path: a thread in C with its own epoll moves a stream's bytes, not Twisted.

The Twisted relay (L{mrunner.proxy.relay.Relay}) costs each event a turn of
the reactor: the read's dispatch, the connection's and the relay's Python, the
write's bookkeeping, and the meter's and the record's look; the bench's
scenario 10 measured it at 2 to 3 times nginx's CPU per event. Here, once the
head is out, a chunked answer passed on unchanged is moved by one thread that
never takes the GIL: an C{epoll} over every such stream's runner socket, and
for each readable one a C{recv}, the chunk-size lines read (as L{ChunkedEnd}
reads them, so the end is found as before) and a C{send}; a read that leaves
bytes to hold (L{ChunkedEnd.held}: a size line cut, or the body's end begun)
goes to the reactor unsent, which holds them. The bytes sent are kept aside
and shown to the observers (the key's meter, the request's record) a batch at
a time on the reactor thread: the first one at once (the record's first
byte), then every 64 KiB, then the rest at the end.

Anything but the next event gives the stream back to the Twisted relay, which
goes on from that byte as if it had moved them all: the body's end (whose
last bytes the reactor sends, then ends the answer, and the connection goes
back to its pool, so a client never has the end before the daemon does), the
runner's close or error (its reactor read then sees it and cuts the answer as before), the
client's leaving or its full socket (the bytes not sent are written by Twisted,
which then applies backpressure), and a cancel from the reactor (L{reclaim}).
While the thread has a stream, the reactor neither reads nor writes its
sockets; the thread uses duplicates of their descriptors, so a descriptor the
reactor closed can never be another connection's.

The loop is C's (L{mrunner.proxy.cmover}, C{mover.c}), which runs no Python
per event; this module is its Python side: which streams it takes, and how
the Twisted relay goes on from where it hands one back. A machine without a C
compiler keeps every stream on the Twisted relay. Why not C{os.splice}: it
would move the bytes without a copy but hide them from the chunk-size reading,
the meter and the record, which need them anyway.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from twisted.internet import tcp

from mrunner.proxy.connection import RunnerConnection
from mrunner.proxy.fastio import reading, writable_now
from mrunner.proxy.relay import Observer, Relay
from mrunner.proxy.wire import ChunkedEnd


class Moved:
    """One stream the thread moves: its sockets (duplicates), its end's state, and what it hands back.

    Handed back, C{pending} is what the client's socket did not take, C{extra}
    what came after the body's end, C{ended} whether it ended, and C{raw} bytes
    the thread read but could not parse (the reactor parses them, and fails, as
    it would have).
    """

    def __init__(self, runner: socket.socket, client: socket.socket, chunks: ChunkedEnd) -> None:
        self.runner = runner
        self.client = client
        self.chunks = chunks
        self.aside: list[bytes] = []
        self.aside_size = 0
        self.shown = False  # the observers have seen a first batch
        self.pending = b""
        self.extra = b""
        self.raw = b""
        self.ended = False
        self.given_back = False


def show_aside(moved: Moved, lock: threading.Lock, observers: list[Observer]) -> None:
    """Show C{observers} the bytes the thread sent and kept aside since the last time."""
    with lock:
        aside, moved.aside, moved.aside_size = moved.aside, [], 0
    if aside:
        data = b"".join(aside)
        for observer in observers:
            observer.write(data)


#: Makes the thread's loop from C{(call_soon, show, back)} (L{mrunner.proxy.cmover.CMover}).
MoverFactory = Callable[[Any, Any, Any], Any]


class FastRelay:
    """Moves a pass-through chunked answer's body in the thread where it can; else leaves it to the
    Twisted relay (L{take})."""

    def __init__(self, reactor: Any, mover: MoverFactory) -> None:
        self._reactor = reactor
        self._make = mover
        self._made: Any = None  # the mover, made (its thread started) for the first stream
        self._taken: dict[Moved, tuple[Relay, RunnerConnection, list[Observer]]] = {}
        #: Streams the thread has taken, to tell which relay served them.
        self.moved = 0

    def take(self, relay: Relay, connection: RunnerConnection) -> bool:
        """Move the rest of C{relay}'s body in the thread, if both sockets are plain and idle."""
        request = relay.request
        client = request.channel.transport if request.channel is not None else None
        runner = connection.transport
        chunks = connection.chunks
        if isinstance(client, tcp.Connection) and not client.TLS and not writable_now(client):
            client.doWrite()  # the head, queued by Twisted for the reactor's next turn: sent now
        if not (
            chunks is not None
            and connection.relaying is relay
            and writable_now(client)
            and writable_now(runner)
            and reading(self._reactor, client)
            and reading(self._reactor, runner)
        ):
            return False
        client.stopReading()  # type: ignore[union-attr]
        runner.stopReading()  # type: ignore[union-attr]
        moved = Moved(duplicate(runner.socket), duplicate(client.socket), chunks)  # type: ignore[union-attr]
        try:
            self._mover.add(moved)
        except OSError:  # no descriptor or epoll entry to spare: the Twisted relay goes on
            client.startReading()  # type: ignore[union-attr]
            runner.startReading()  # type: ignore[union-attr]
            return False
        self._taken[moved] = (relay, connection, relay.watching())
        relay.taken = lambda: self._reclaim(moved)
        self.moved += 1
        return True

    @property
    def _mover(self) -> Any:
        if self._made is None:
            self._made = self._make(self._reactor.callFromThread, self._show, self._back)
        return self._made

    def _show(self, moved: Moved) -> None:
        taken = self._taken.get(moved)
        if taken is not None:
            show_aside(moved, self._mover.lock, taken[2])

    def _reclaim(self, moved: Moved) -> None:
        """The reactor acts on the stream (its client went away): have it back first."""
        if self._mover.take_back(moved):
            self._back(moved)

    def _back(self, moved: Moved) -> None:
        """Go on with the Twisted relay from where the thread left the stream."""
        taken = self._taken.pop(moved, None)
        if taken is None:
            return  # taken back already
        relay, connection, observers = taken
        relay.taken = None
        show_aside(moved, self._mover.lock, observers)
        channel = relay.request.channel
        client: Any = channel.transport if channel is not None else None
        if client is not None and client.connected and not client.disconnecting:
            client.startReading()
        runner = _transport(connection)
        if not moved.ended and runner.connected:
            runner.startReading()  # before the write, which may pause it again
        if moved.pending:
            relay.write(moved.pending)
        if moved.ended:
            connection.ended_elsewhere(moved.extra)
        elif moved.raw and runner.connected:
            connection.dataReceived(moved.raw)


def _transport(connection: RunnerConnection) -> Any:
    return connection.transport


def duplicate(sock: socket.socket) -> socket.socket:
    """A duplicate of C{sock}, non-blocking, for the thread alone."""
    twin = socket.socket(sock.family, sock.type, fileno=os.dup(sock.fileno()))
    twin.setblocking(False)
    return twin
