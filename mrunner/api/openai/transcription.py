"""An OpenAI audio request's form, checked, and the form its runner (whisper-server) is sent.

OpenAI's fields: C{file}, C{model}, C{language}, C{prompt}, C{response_format} (json, text, srt,
vtt, verbose_json), C{temperature} and C{timestamp_granularities[]} (word, segment: with
verbose_json only, as OpenAI has it); C{keep_alive} as on every mrunner route. Everything is
checked here, the file's format and duration included (L{mrunner.api.reading.audio}), so a request
the runner would refuse, or choke on, is a 400 in OpenAI's shape before a runner is asked for.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mrunner.api.door.declared import MAX_AUDIO_BYTES
from mrunner.api.reading import audio, form
from mrunner.errors import BadRequest

#: The longest audio taken: whisper-server transcribes it in one request, holding its samples.
MAX_AUDIO_SECONDS = 30 * 60
FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("word", "segment")
MAX_PROMPT_BYTES = 4096
_LANGUAGE = re.compile(r"[a-z]{2,3}|auto")
_TEXT_FIELDS = ("model", "language", "prompt", "response_format", "temperature", "keep_alive")
_GRANULARITY_FIELDS = ("timestamp_granularities[]", "timestamp_granularities")


@attrs.frozen
class Transcription:
    """A checked request: the audio and what whisper-server is asked to do with it."""

    file: bytes
    filename: str
    audio: audio.Audio
    response_format: str = "json"
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    granularities: tuple[str, ...] = ()

    def runner_form(self, translate: bool) -> tuple[bytes, bytes]:
        """The C{multipart/form-data} body for whisper-server's C{/inference}, and its content type."""
        fields: list[tuple[str, str]] = [("response_format", self.response_format)]
        if self.language is not None:
            fields.append(("language", self.language))
        if self.prompt is not None:
            fields.append(("prompt", self.prompt))
        if self.temperature is not None:
            fields.append(("temperature", repr(self.temperature)))
        if translate:
            fields.append(("translate", "true"))
        boundary = os.urandom(12).hex()
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
            for name, value in fields
        ]
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file";'
            f' filename="audio.{self.audio.format}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        body = b"".join([*parts, head, self.file, f"\r\n--{boundary}--\r\n".encode()])
        return body, f"multipart/form-data; boundary={boundary}".encode()


def payload(body: bytes, content_type: bytes | None) -> dict[str, Any]:
    """The form as the gateway reads a payload: each text field once, as text; the file's part as is."""
    found = form.fields(body, content_type)
    unknown = sorted(set(found) - {"file", *_TEXT_FIELDS, *_GRANULARITY_FIELDS})
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}", code="unknown_parameter", param=unknown[0])
    values: dict[str, Any] = {}
    for name in _TEXT_FIELDS:
        parts = found.get(name, [])
        if len(parts) > 1:
            raise BadRequest(f"the field {name!r} is given {len(parts)} times", param=name)
        if parts:
            values[name] = _decoded(name, parts[0].value)
    values["timestamp_granularities"] = [
        _decoded(name, part.value) for name in _GRANULARITY_FIELDS for part in found.get(name, [])
    ]
    files = found.get("file", [])
    if len(files) != 1 or files[0].filename is None:
        raise BadRequest("give one audio file as the form's file field", code="missing_file", param="file")
    values["file"] = files[0]
    return values


def _decoded(name: str, value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"the field {name!r} is not UTF-8 text", param=name) from None


def check(values: Mapping[str, Any]) -> Transcription:
    """The request L{payload} read, checked whole (L{BadRequest} naming the field to blame)."""
    part: form.Part = values["file"]
    if len(part.value) > MAX_AUDIO_BYTES:
        raise BadRequest(f"the file is over {MAX_AUDIO_BYTES} bytes", code="file_too_large", param="file")
    heard = audio.read(part.value, part.filename)
    if heard.seconds is not None and heard.seconds > MAX_AUDIO_SECONDS:
        raise BadRequest(
            f"the audio lasts {heard.seconds:.0f} s; at most {MAX_AUDIO_SECONDS} s are transcribed at once",
            code="audio_too_long",
            param="file",
        )
    response_format = values.get("response_format", "json")
    if response_format not in FORMATS:
        raise BadRequest(
            f"response_format must be one of {', '.join(FORMATS)}, not {response_format[:40]!r}",
            param="response_format",
        )
    granularities = _granularities(values["timestamp_granularities"], response_format)
    return Transcription(
        part.value,
        part.filename or "",
        heard,
        response_format,
        _language(values.get("language")),
        _prompt(values.get("prompt")),
        _temperature(values.get("temperature")),
        granularities,
    )


def _granularities(given: Sequence[str], response_format: str) -> tuple[str, ...]:
    for value in given:
        if value not in GRANULARITIES:
            raise BadRequest(
                f"timestamp_granularities[] takes word and segment, not {value[:40]!r}",
                param="timestamp_granularities[]",
            )
    if given and response_format != "verbose_json":
        raise BadRequest(
            "timestamp_granularities[] needs response_format verbose_json", param="timestamp_granularities[]"
        )
    return tuple(given)


def _language(value: str | None) -> str | None:
    if value is not None and not _LANGUAGE.fullmatch(value):
        raise BadRequest(
            f"language is an ISO-639-1 code such as en or de, not {value[:40]!r}", param="language"
        )
    return value


def _prompt(value: str | None) -> str | None:
    if value is not None and len(value.encode()) > MAX_PROMPT_BYTES:
        raise BadRequest(f"the prompt is over {MAX_PROMPT_BYTES} bytes", param="prompt")
    return value


def _temperature(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0.0 <= number <= 1.0:
        raise BadRequest(f"temperature is a number from 0 to 1, not {value[:40]!r}", param="temperature")
    return number


def recorded(values: Mapping[str, Any]) -> bytes:
    """What a request's record keeps of its body: the text fields and the file's name and size, no audio."""
    part: form.Part = values["file"]
    kept = {name: values[name] for name in _TEXT_FIELDS if name in values}
    kept["file"] = {"filename": part.filename, "bytes": len(part.value)}
    if values["timestamp_granularities"]:
        kept["timestamp_granularities"] = values["timestamp_granularities"]
    return json.dumps(kept).encode()
