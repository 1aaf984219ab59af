"""The I/O that reaches into Twisted's private attributes, for the hot path's sake; nothing else does.

Each reach is measured and each is pinned: tests/unit/test_twisted_privates.py
fails when a Twisted release renames or reshapes what is used here, and
pyproject.toml bounds Twisted to the releases that test has passed on.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import epollreactor, tcp, unix


def send_now(transport: Any, data: bytes) -> None:
    """Write C{data} to a TCP or UNIX connection, sending it at once when nothing is queued before it.

    Twisted queues every write for the reactor's next turn, registering the
    socket for writability and unregistering it once sent: two C{epoll_ctl}
    calls and a turn of the loop for each request sent to a runner and each
    event streamed to a client, where the socket could take it at once. What
    the socket does not take is queued as before, and later writes queue
    behind it, so the order holds. Private: C{_tempDataBuffer}, the queue of
    writes not yet joined into C{dataBuffer}.
    """
    if writable_now(transport):
        sent = transport.writeSomeData(data)
        if isinstance(sent, int):
            data = data[sent:]
    if data:
        transport.write(data)


def writable_now(transport: Any) -> bool:
    """A plain TCP or UNIX connection (not TLS), open, with nothing queued to write before what comes."""
    return bool(
        isinstance(transport, tcp.Connection)
        and not transport.TLS
        and transport.connected
        and not transport.disconnecting
        and not transport.dataBuffer
        and not transport._tempDataBuffer
    )


def reading(reactor: Any, transport: Any) -> bool:
    """Whether C{reactor} reads C{transport} now, without a list of every reader.

    C{getReaders()} builds a list of the reactor's readers, each stream's two
    connections among them: the fast relay asked it twice a stream, 2,000
    entries with a thousand streams open. Private: the epoll reactor's
    C{_reads}, the descriptors it reads; another reactor is asked publicly.
    """
    if isinstance(reactor, epollreactor.EPollReactor):
        return transport.fileno() in reactor._reads
    return transport in reactor.getReaders()


class RecvClient(unix.Client):
    """A UNIX client transport that reads with plain C{recv}: no file descriptors come from a runner.

    Twisted's UNIX transport reads with C{recvmsg} and an ancillary buffer,
    for descriptors passed over the socket.
    """

    doRead = tcp.Connection.doRead  # type: ignore[assignment]


class RecvConnector(unix.Connector):
    """A UNIX connector whose connections are L{RecvClient}s. Private: C{_makeTransport}."""

    def _makeTransport(self) -> unix.Client:  # type: ignore[override]
        return RecvClient(self.address, self, self.reactor, self.checkPID)
