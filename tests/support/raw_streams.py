"""Streams read over plain sockets, read by read: what a client that wants the end in its last read sees.

curl and httpx find a chunked answer's end in whatever reads it comes; simpler clients (the bench's
own load once) look for it at the end of a read, and wait for the connection's close where it came
cut in two. Reading so makes an end that comes cut, or late, a failure rather than a wait.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

END = b"0\r\n\r\n"


def chat_request(body: dict[str, Any], path: str = "/v1/chat/completions") -> bytes:
    """A whole HTTP/1.1 request posting C{body} as JSON."""
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    return head.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data


def connect(address: str | tuple[str, int], timeout: float) -> socket.socket:
    """A connection to a UNIX socket path or a (host, port)."""
    if isinstance(address, str):
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.settimeout(timeout)
        unix.connect(address)
        return unix
    return socket.create_connection(address, timeout=timeout)


def read_stream(
    address: str | tuple[str, int], request: bytes, timeout: float = 60.0
) -> tuple[float, list[bytes]]:
    """Send C{request}, read its head, then its body until a read ends with a chunked body's end (or
    the close, or C{timeout}); the seconds that took and the body's reads."""
    started = time.monotonic()
    reads: list[bytes] = []
    head = b""
    with connect(address, timeout) as client:
        client.sendall(request)
        try:
            while b"\r\n\r\n" not in head:
                head += client.recv(65536) or b"\r\n\r\n"
            reads.append(head.partition(b"\r\n\r\n")[2])  # the body's first bytes, if they came with it
            while not reads[-1].endswith(END):
                reads.append(client.recv(65536))
                if not reads[-1]:
                    break
        except TimeoutError:
            reads.append(b"")
    return time.monotonic() - started, reads


def ended_whole(reads: list[bytes]) -> bool:
    """Whether the answer's last read ended with the body's end, after a [DONE] event."""
    return bool(reads) and reads[-1].endswith(END) and b"data: [DONE]" in b"".join(reads[-3:])
