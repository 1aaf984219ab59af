"""A ``multipart/form-data`` body read into its fields, strictly, as OpenAI's audio routes take it.

The whole body is in memory (it is within its route's limit when this runs), so the parts are
slices of it: no temporary files, one copy of the audio. The body is walked delimiter by delimiter
and the walk stops at the L{MAX_FIELDS}th part: splitting 25 MiB of 2-byte parts first made
millions of pieces (RSS 84 → 426 MB, C{/health} 700 ms late) before the count refused them.
"""

from __future__ import annotations

import re

import attrs

from mrunner.errors import BadRequest

#: The most fields a form may hold; OpenAI's audio requests have under ten.
MAX_FIELDS = 32
_BOUNDARY = re.compile(rb'boundary=(?:"([^"]{1,70})"|([^\s;]{1,70}))', re.IGNORECASE)
_DISPOSITION = re.compile(rb"^content-disposition:\s*form-data(.*)$", re.IGNORECASE | re.MULTILINE)
_PARAM = re.compile(rb';\s*(name|filename)="((?:[^"\\]|\\.)*)"', re.IGNORECASE)


@attrs.frozen
class Part:
    """One field: its value's bytes, and its file name where the client sent a file."""

    value: bytes
    filename: str | None = None


def boundary(content_type: bytes | None) -> bytes:
    """The boundary of a C{multipart/form-data} content type, else L{BadRequest}."""
    kind = (content_type or b"").split(b";")[0].strip().lower()
    match = _BOUNDARY.search(content_type or b"")
    if kind != b"multipart/form-data" or match is None:
        raise BadRequest(
            "the body must be multipart/form-data (a file and the fields beside it),"
            f" not {kind.decode(errors='replace') or 'untyped'}",
            code="invalid_content_type",
        )
    return match[1] or match[2]


def fields(body: bytes, content_type: bytes | None) -> dict[str, list[Part]]:
    """Each field's parts by name, in order (a name may repeat: C{timestamp_granularities[]})."""
    delimiter = b"--" + boundary(content_type)
    found: dict[str, list[Part]] = {}
    at, count = body.find(delimiter), 0
    while at >= 0 and not body.startswith(b"--", at + len(delimiter)):
        start = at + len(delimiter)
        at = body.find(delimiter, start)
        if at < 0:
            break
        count += 1
        if count > MAX_FIELDS:
            raise BadRequest(f"a form may hold at most {MAX_FIELDS} fields", code="invalid_multipart")
        name, part = _part(body, start, at)
        found.setdefault(name, []).append(part)
    if at < 0 or not count:
        raise BadRequest("the multipart body is cut short or malformed", code="invalid_multipart")
    return found


def _part(body: bytes, start: int, end: int) -> tuple[str, Part]:
    """The part between two delimiters, C{body[start:end]}: CRLF, its headers, a blank line, its value,
    CRLF; its value copied once."""
    blank = body.find(b"\r\n\r\n", start, end)
    if blank < 0 or not body.startswith(b"\r\n", start) or not body.endswith(b"\r\n", blank + 4, end):
        raise BadRequest("a part of the multipart body is malformed", code="invalid_multipart")
    disposition = _DISPOSITION.search(body[start:blank])
    params = {key.lower(): text for key, text in _PARAM.findall(disposition[1])} if disposition else {}
    if b"name" not in params:
        raise BadRequest("a part of the multipart body has no field name", code="invalid_multipart")
    filename = params.get(b"filename")
    value = body[blank + 4 : end - 2]
    return _text(params[b"name"]), Part(value, None if filename is None else _text(filename))


def _text(raw: bytes) -> str:
    return raw.replace(b'\\"', b'"').decode("utf-8", errors="replace")
