"""A runner's HTTP/1.1 on the wire: the request mrunner writes, the answer's head, and a chunked body's end.

A runner is a known HTTP/1.1 server, so only an answer's status line and
headers are parsed; the body is handed on as it arrives, its framing
included: the end of a chunked body is found by reading the chunk-size lines
alone, never copying the data. Twisted's C{Agent} decodes every chunk (for
the proxy to encode it again), and its UNIX transport reads with C{recvmsg}
and an ancillary buffer (see L{mrunner.proxy.fastio}): together about half
the proxy's CPU per streamed event.
"""

from __future__ import annotations

from twisted.web.http_headers import Headers

HEX_DIGITS = b"0123456789abcdefABCDEF"
#: An answer's head longer than this is not a runner's.
MAX_HEAD = 64 * 1024
#: How an answer's body ends: chunked framing, a Content-Length, the connection's close, or no body.
CHUNKED, LENGTH, CLOSE, EMPTY = "chunked", "length", "close", "empty"


class Malformed(Exception):
    """The runner's bytes are not HTTP/1.1 this client understands."""


def request_bytes(method: bytes, path: bytes, headers: Headers, body: bytes) -> bytes:
    """A whole HTTP/1.1 request, to be written at once."""
    parts = [method, b" ", path, b" HTTP/1.1\r\nHost: runner\r\nContent-Length: %d\r\n" % len(body)]
    for name, values in headers.getAllRawHeaders():
        for value in values:
            parts += (name, b": ", value, b"\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)


class Head:
    """An answer's status line and header fields, and how its body is framed."""

    __slots__ = ("code", "fields", "framing", "keep_alive", "length", "phrase")

    def __init__(self, data: bytes, method: bytes):
        lines = data.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, self.phrase = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise Malformed(f"the status line {lines[0][:80]!r} is not HTTP/1.x")
        self.code = int(code)
        #: (lower-case name, name, value) for every field, in order.
        self.fields: list[tuple[bytes, bytes, bytes]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise Malformed(f"the header line {line[:80]!r} has no colon")
            self.fields.append((name.strip().lower(), name.strip(), value.strip()))
        connection = self.tokens(b"connection")
        persistent = version == b"HTTP/1.1" or b"keep-alive" in connection
        self.keep_alive = persistent and b"close" not in connection
        self.length = -1
        if method == b"HEAD" or self.code in (204, 304):
            self.framing = EMPTY
        elif b"chunked" in self.tokens(b"transfer-encoding"):
            self.framing = CHUNKED
        elif (length := self.value(b"content-length")) is not None:
            if not length.isdigit():
                raise Malformed(f"Content-Length {length[:40]!r} is not a number")
            self.length = int(length)
            self.framing = LENGTH if self.length else EMPTY
        else:
            self.framing = CLOSE
            self.keep_alive = False

    def value(self, name: bytes) -> bytes | None:
        """The first value of field C{name} (lower case), if any."""
        for lower, _, value in self.fields:
            if lower == name:
                return value
        return None

    def tokens(self, name: bytes) -> set[bytes]:
        """The comma-separated tokens of every C{name} field, lower case."""
        return {
            token.strip().lower()
            for lower, _, value in self.fields
            if lower == name
            for token in value.split(b",")
        }


class ChunkedEnd:
    """Finds where a chunked body ends, reading its chunk-size lines alone.

    C{feed} is given each piece of the body as it arrives and answers where
    in it the body ended (-1: not yet). With C{payload} given, it also gets the
    chunks' data without their framing, for a client that cannot take chunks.

    A relay passes on what was fed but the last L{held} bytes: a size line not
    yet whole, or the body's end begun (the last chunk's line and what followed
    it) but not yet ended. llama-server writes the end as C{0\r\n}, then
    C{\r\n}, in two writes; a relay that read and passed them on apart gave
    clients that look for the end in one read (the bench's own load among
    them) an end that never came, until the idle connection was closed a
    minute later. Held, the end goes out whole, with the bytes before it.
    """

    def __init__(self) -> None:
        self._skip = 0  # bytes of the current chunk's data, and its CRLF, still to come
        self._line = b""  # the start of a size or trailer line cut by the end of a read
        self._trailer = False  # past the last chunk: reading trailer lines until an empty one
        self._ending = 0  # bytes fed since the last chunk's line began, while the end is not whole

    def state(self) -> tuple[int, bytes, bool]:
        """Where the reading stands, to L{restore} after a piece that L{feed} found malformed."""
        return self._skip, self._line, self._trailer

    def restore(self, state: tuple[int, bytes, bool]) -> None:
        self._skip, self._line, self._trailer = state
        self._ending = 0

    @property
    def held(self) -> int:
        """How many of the last bytes fed a relay keeps back for now (see the class)."""
        return self._ending if self._trailer else len(self._line)

    def between_chunks(self) -> bool:
        """Whether what was fed ends with a whole chunk, so another could follow."""
        return not self._skip and not self._line and not self._trailer

    def feed(self, data: bytes, payload: list[bytes] | None = None) -> int:
        skip = self._skip
        if skip >= len(data) and payload is None:
            self._skip = skip - len(data)  # the common case: a read inside a chunk's data
            return -1
        if self._trailer:
            self._ending += len(data)
        buffer, start = (self._line + data, len(self._line)) if self._line else (data, 0)
        self._line = b""
        position = 0
        while True:
            if skip:
                taken = min(skip, len(buffer) - position)
                if payload is not None and skip > 2:
                    payload.append(buffer[position : position + min(taken, skip - 2)])
                position += taken
                skip -= taken
                if skip:
                    self._skip = skip
                    return -1
                if position == len(buffer):  # the read ended with the chunk, as a runner's event does
                    self._skip = 0
                    return -1
            end = buffer.find(b"\r\n", position)
            if end < 0:
                self._line = buffer[position:]
                if len(self._line) > 4096:
                    raise Malformed("a chunk-size line is longer than 4 KiB")
                self._skip = 0
                return -1
            line, began = buffer[position:end], position
            position = end + 2
            if self._trailer:
                if not line:
                    return position - start
                continue
            size = line.partition(b";")[0].strip()
            if not size or size.strip(HEX_DIGITS):
                raise Malformed(f"the chunk size {size[:40]!r} is not hexadecimal")
            skip = int(size, 16) + 2
            if skip == 2:
                self._trailer, skip = True, 0
                self._ending = len(buffer) - began
