"""twisted.web's private names the front door needs, behind public ones: the api layer's only reach.

The door refuses what twisted.web's HTTP/1.1 parser would drop unanswered, and
fills a request from a head httptools read, so it needs some of L{HTTPChannel}'s
private state: the request line it parsed (C{_command}, C{_path}, C{_version}),
the header counts, the body decoder it chose (C{_transferDecoder}) and the hooks
around it. L{PrivateChannel} is L{HTTPChannel} with those under public names and
hooks, so L{mrunner.api.door.channel} and L{mrunner.api.door.httptools_channel} use no
private name. Each one used here is pinned by tests/unit/test_twisted_privates.py,
and pyproject.toml bounds Twisted to the releases that test has passed on.
"""

from __future__ import annotations

from typing import Any

from twisted.web.http import HTTPChannel, _ChunkedTransferDecoder, _MalformedChunkedDataError
from twisted.web.http_headers import Headers, _nameEncoder

#: The headers that frame a request's body, in twisted.web's case.
LENGTH_HEADERS = (b"Content-Length", b"Transfer-Encoding")
# A body of 2**63 bytes is past any limit: a chunk size beyond it is malformed.
MAX_CHUNK_SIZE = 2**63 - 1

#: A header's name in twisted.web's case (remembered once seen).
canonical_name = _nameEncoder.encode


class SizedChunks(_ChunkedTransferDecoder):
    """twisted.web's reader of a chunked body, refusing a chunk size no body can have (it takes any)."""

    def _dataReceived_CHUNK_LENGTH(self) -> bool:
        read = bool(super()._dataReceived_CHUNK_LENGTH())
        if read and self.length > MAX_CHUNK_SIZE:
            raise _MalformedChunkedDataError(
                f"a chunk size of {len(f'{self.length:x}')} hex digits is past 2**63"
            )
        return read


class PrivateChannel(HTTPChannel):
    """L{HTTPChannel} with the private state the front door reads and writes under public names.

    Hooks a subclass overrides: L{too_many_headers}, L{content_length} (a
    C{Content-Length} before twisted.web reads it), L{malformed} (a head or chunked
    body twisted.web cannot parse).
    """

    @property
    def command(self) -> bytes:
        """The pending request's method, as its request line gave it."""
        command: bytes = self._command
        return command

    @property
    def target(self) -> bytes:
        """The pending request's target, as its request line gave it."""
        target: bytes = self._path
        return target

    def unended_line(self) -> bool:
        """Whether a whole read ended holding, in line mode and not paused, a line with an LF and no CRLF."""
        return bool(self.line_mode) and not self.paused and not self._busyReceiving and b"\n" in self._buffer

    def fill_head(
        self,
        headers: Headers,
        method: bytes,
        target: bytes,
        version: bytes,
        fields: dict[bytes, list[bytes]],
        count: int,
    ) -> bool:
        """Take a head read elsewhere as twisted.web's line parser would have: request line, C{headers}'
        raw fields (canonical names), the body's framing; False when a framing header was refused."""
        self._command, self._path, self._version = method, target, version
        headers._rawHeaders = fields
        for name in LENGTH_HEADERS:
            for value in fields.get(name, ()):
                if not self._maybeChooseTransferDecoder(name, value):
                    return False
        self._receivedHeaderCount = count
        return True

    def too_many_headers(self) -> None:
        """A header past C{maxHeaders}; by default twisted.web's answer."""
        super()._respondToBadRequestAndDisconnect()

    def content_length(self, data: bytes) -> bool:
        """Whether twisted.web may read the C{Content-Length} C{data}; a refusal answers the request."""
        return True

    def malformed(self, why: str | None) -> None:
        """A head (C{why} None) or chunked body twisted.web cannot parse; by default twisted.web's answer."""
        super()._respondToBadRequestAndDisconnect()

    def headerReceived(self, line: bytes) -> bool:
        if self._receivedHeaderCount >= self.maxHeaders:
            self.too_many_headers()
            return False
        return bool(super().headerReceived(line))

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:
        if header == b"Content-Length" and not self.content_length(data):
            return False
        chosen = bool(super()._maybeChooseTransferDecoder(header, data))
        if chosen and type(self._transferDecoder) is _ChunkedTransferDecoder:
            self._transferDecoder = SizedChunks(self.requests[-1].handleContentChunk, self._finishRequestBody)
        return chosen

    def _respondToBadRequestAndDisconnect(self) -> None:
        self.malformed(None)

    def rawDataReceived(self, data: bytes) -> None:
        if self._handlingRequest:
            super().rawDataReceived(data)
            return
        decoder: Any = self._transferDecoder  # set while a body is read
        try:
            decoder.dataReceived(data)
        except _MalformedChunkedDataError as e:
            self.malformed(str(e))
