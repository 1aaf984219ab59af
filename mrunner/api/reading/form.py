"""A ``multipart/form-data`` body read into its fields, strictly, as OpenAI's audio routes take it.

The whole body is in memory (it is within its route's limit when this runs), so the parts are
slices of it: no temporary files, no second copy of the audio.
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
    pieces = body.split(delimiter)
    if len(pieces) < 3 or not pieces[-1].startswith(b"--"):
        raise BadRequest("the multipart body is cut short or malformed", code="invalid_multipart")
    found: dict[str, list[Part]] = {}
    for piece in pieces[1:-1]:
        name, part = _part(piece)
        found.setdefault(name, []).append(part)
        if sum(map(len, found.values())) > MAX_FIELDS:
            raise BadRequest(f"a form may hold at most {MAX_FIELDS} fields", code="invalid_multipart")
    return found


def _part(piece: bytes) -> tuple[str, Part]:
    """A part between two delimiters: CRLF, its headers, a blank line, its value, CRLF."""
    head, blank, value = piece.partition(b"\r\n\r\n")
    if not blank or not head.startswith(b"\r\n") or not value.endswith(b"\r\n"):
        raise BadRequest("a part of the multipart body is malformed", code="invalid_multipart")
    disposition = _DISPOSITION.search(head)
    params = {key.lower(): text for key, text in _PARAM.findall(disposition[1])} if disposition else {}
    if b"name" not in params:
        raise BadRequest("a part of the multipart body has no field name", code="invalid_multipart")
    filename = params.get(b"filename")
    return _text(params[b"name"]), Part(value[:-2], None if filename is None else _text(filename))


def _text(raw: bytes) -> str:
    return raw.replace(b'\\"', b'"').decode("utf-8", errors="replace")
