"""The pass-through relay's fast path: a thread with its own epoll moves a stream's bytes, not the reactor.

The Twisted relay (L{mrunner.runners.relay.Relay}) costs each event a turn of
the reactor: the read's dispatch, the connection's and the relay's Python, the
write's bookkeeping, and the meter's and the record's look; the bench's
scenario 10 measured it at 2 to 3 times nginx's CPU per event. Here, once the
head is out, a chunked answer passed on unchanged is moved by one thread: an
C{epoll} over every such stream's runner socket, and for each readable one a
C{recv}, the chunk-size lines read (L{ChunkedEnd}, the connection's own, so
the end is found as before) and a C{send}, the GIL released in each system
call; a read that leaves bytes to hold (L{ChunkedEnd.held}: a size line cut,
or the body's end begun) goes to the reactor unsent, which holds them. The
bytes sent are kept aside and shown to the observers (the key's meter, the
request's record) a batch at a time on the reactor thread: the first one at
once (the record's first byte), then every L{BATCH} bytes, then the rest at
the end.

Anything but the next event gives the stream back to the Twisted relay, which
goes on from that byte as if it had moved them all: the body's end (whose
last bytes the reactor sends, then ends the answer, and the connection goes
back to its pool, so a client never has the end before the daemon does), the runner's close
or error (its reactor read then sees it and cuts the answer as before), the
client's leaving or its full socket (the bytes not sent are written by Twisted,
which then applies backpressure), and a cancel from the reactor (L{reclaim}).
While the thread has a stream, the reactor neither reads nor writes its
sockets; the thread uses duplicates of their descriptors, so a descriptor the
reactor closed can never be another connection's.

The loop is L{Mover} here, in Python (C{[http] relay = "python"}, and where
no C compiler is found), or the same rules in C (L{mrunner.runners.cmover},
the default), which runs no Python per event. Why not C{os.splice}: it would
move the bytes without a copy but hide them from the chunk-size reading, the
meter and the record, which need them anyway.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from twisted.internet import tcp

from mrunner.runners.connection import RunnerConnection
from mrunner.runners.fastio import reading, writable_now
from mrunner.runners.relay import Observer, Relay
from mrunner.runners.wire import ChunkedEnd, Malformed

#: Bytes kept aside before they are shown to the observers on the reactor thread.
BATCH = 64 * 1024
READ_SIZE = 64 * 1024
_CLIENT_GONE = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


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


class Mover:
    """The thread and its epoll: moves every L{Moved} stream until it must be handed back.

    C{call_soon(f, *args)} runs C{f} on the reactor thread (C{reactor.callFromThread}):
    C{show(moved)} to show the bytes kept aside, C{back(moved)} once it is handed back.
    """

    def __init__(self, call_soon: Any, show: Any, back: Any) -> None:
        self._call_soon = call_soon
        self._show = show
        self._back = back
        self._epoll = select.epoll()
        self._streams: dict[int, Moved] = {}
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, moved: Moved) -> None:
        """Start moving C{moved} (from the reactor thread)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mrunner-relay", daemon=True)
            self._thread.start()
        with self.lock:
            self._streams[moved.runner.fileno()] = moved
            self._streams[moved.client.fileno()] = moved
            self._epoll.register(moved.client.fileno(), select.EPOLLRDHUP)
            self._epoll.register(moved.runner.fileno(), select.EPOLLIN)

    def take_back(self, moved: Moved) -> bool:
        """Stop moving C{moved} now (from the reactor thread); False if it was handed back already."""
        with self.lock:
            if moved.given_back:
                return False
            self._forget(moved)
            return True

    def _forget(self, moved: Moved) -> None:
        moved.given_back = True
        for sock in (moved.runner, moved.client):
            self._streams.pop(sock.fileno(), None)
            self._epoll.unregister(sock.fileno())
            sock.close()

    def _run(self) -> None:
        poll = self._epoll.poll
        while True:
            ready = poll()
            with self.lock:
                for fd, mask in ready:
                    moved = self._streams.get(fd)
                    if moved is None:
                        continue
                    if fd == moved.runner.fileno():
                        self._move(moved)
                    elif mask & _CLIENT_GONE:
                        self._hand_back(moved)

    def _move(self, moved: Moved) -> None:
        try:
            data = moved.runner.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # closed or failed: the reactor's own read will see it
            self._hand_back(moved)
            return
        chunks = moved.chunks
        state = chunks.state()
        try:
            end = chunks.feed(data)
        except Malformed:
            end = -2
        if end == -2 or (end < 0 and chunks.held):  # malformed, or bytes to hold: the reactor reads them
            chunks.restore(state)
            moved.raw = data
            self._hand_back(moved)
            return
        if end >= 0:
            # The body's last bytes go out from the reactor, as with the Twisted relay: a client that
            # has them finds the answer over there (its record kept, its tokens counted).
            moved.pending, moved.extra, moved.ended = data[:end], data[end:], True
            self._hand_back(moved)
            return
        try:
            sent = moved.client.send(data)
        except OSError:  # full, or gone: Twisted writes it, and sees which
            sent = 0
        if sent:
            self._aside(moved, data[:sent] if sent < len(data) else data)
        if sent < len(data):
            moved.pending = data[sent:]
            self._hand_back(moved)

    def _aside(self, moved: Moved, data: bytes) -> None:
        moved.aside.append(data)
        moved.aside_size += len(data)
        if not moved.shown or moved.aside_size >= BATCH:
            moved.shown = True
            self._call_soon(self._show, moved)

    def _hand_back(self, moved: Moved) -> None:
        self._forget(moved)
        self._call_soon(self._back, moved)


def show_aside(moved: Moved, lock: threading.Lock, observers: list[Observer]) -> None:
    """Show C{observers} the bytes the thread sent and kept aside since the last time."""
    with lock:
        aside, moved.aside, moved.aside_size = moved.aside, [], 0
    if aside:
        data = b"".join(aside)
        for observer in observers:
            observer.write(data)


#: Makes the thread's loop from C{(call_soon, show, back)}: L{Mover}, or C's (L{mrunner.runners.cmover}).
MoverFactory = Callable[[Any, Any, Any], Any]


class FastRelay:
    """Moves a pass-through chunked answer's body in the thread (L{Mover}) where it can; else leaves it
    to the Twisted relay (L{take})."""

    def __init__(self, reactor: Any, mover: MoverFactory = Mover, loop: str = "python") -> None:
        self._reactor = reactor
        self._make = mover
        #: What the thread's loop is written in: C{"python"} (L{Mover}) or C{"c"}.
        self.loop = loop
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
