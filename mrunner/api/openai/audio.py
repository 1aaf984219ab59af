"""OpenAI's audio routes, C{/v1/audio/transcriptions} and C{/v1/audio/translations}, served by a
Whisper model's runner (whisper.cpp's ``whisper-server``) under C{/v1}, C{/engines/v1} and
C{/engines/whisper.cpp/v1}.

A request takes the gateway's path as every inference does (the key, the record, the queue, the
budget), with its form checked first (L{transcription}); the runner is sent a form of its own
making, C{translate} set for a translation, and its answer (JSON, text, SRT or WebVTT) is read
whole and given OpenAI's shape (L{transcript}). A client that leaves aborts the runner's
connection, and whisper-server's abort callback stops its work at the next step.
"""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.web.server import Request

from mrunner.api.documented import Documented
from mrunner.api.door.declared import MAX_AUDIO_BYTES, MAX_AUDIO_FORM, Route
from mrunner.api.errors import handle_json_errors, openai_shape
from mrunner.api.openai import transcript, transcription
from mrunner.api.openai.gateway import Gateway
from mrunner.api.openapi import Piece, answer, errors, operation
from mrunner.errors import BadRequest
from mrunner.proxy.answer import Answer
from mrunner.proxy.forwarder import Forwarder
from mrunner.values.backend import TRANSCRIPTION, WHISPER_CPP

PREFIXES = ("/engines", "/engines/<backend>", "")
TRANSCRIPTIONS = [f"{prefix}/v1/audio/transcriptions" for prefix in PREFIXES]
TRANSLATIONS = [f"{prefix}/v1/audio/translations" for prefix in PREFIXES]

FORM = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["file", "model"],
            "properties": {
                "file": {"type": "string", "format": "binary", "description": "WAV, MP3, FLAC or Ogg Vorbis"},
                "model": {"type": "string"},
                "language": {"type": "string", "description": "ISO-639-1, e.g. en"},
                "prompt": {"type": "string"},
                "response_format": {"enum": list(transcription.FORMATS)},
                "temperature": {"type": "number", "minimum": 0, "maximum": 1},
                "timestamp_granularities[]": {
                    "type": "array",
                    "items": {"enum": list(transcription.GRANULARITIES)},
                },
            },
        }
    }
}
ANSWERS = {
    "200": answer(
        "the text: JSON ({text}), verbose JSON with segments (and words), plain text, SRT or WebVTT",
        {"application/json": {"schema": {"type": "object"}}, "text/plain": {"schema": {"type": "string"}}},
    ),
    **errors(
        **{
            "400": "not audio, an empty or damaged file, over 30 minutes, an unknown field, or not Whisper",
            "413": f"a form over {MAX_AUDIO_BYTES} bytes of audio",
            "500": "the runner failed to start; the message has the tail of its log",
        }
    ),
}


class AudioAPI:
    """Checks an audio request's form, leases a Whisper runner and sends it the audio."""

    app = Klein()
    handle_json_errors(app, openai_shape)
    routes = Documented(app)

    def __init__(self, gateway: Gateway, forwarder: Forwarder):
        self._gateway = gateway
        self._forwarder = forwarder

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        TRANSCRIPTIONS,
        "POST",
        operation("Speech to text (OpenAI)", ANSWERS, body=FORM),
        door=Route(limit=lambda http: MAX_AUDIO_FORM),
    )
    def transcriptions(self, request: Request, backend: str | None = None) -> Any:
        return self._transcribe(request, backend, translate=False)

    @routes.route(
        TRANSLATIONS,
        "POST",
        operation("Speech to English text (OpenAI)", ANSWERS, body=FORM),
        door=Route(limit=lambda http: MAX_AUDIO_FORM),
    )
    def translations(self, request: Request, backend: str | None = None) -> Any:
        return self._transcribe(request, backend, translate=True)

    async def _transcribe(self, request: Request, backend: str | None, translate: bool) -> bytes:
        content_type = request.getHeader(b"content-type")
        asked = self._gateway.begin(
            request,
            TRANSCRIPTION,
            backend or WHISPER_CPP,
            transcription.check,
            decode=lambda body: transcription.payload(body, content_type),
            limit=MAX_AUDIO_FORM,
            recorded=transcription.recorded,
        )
        resolved = asked.resolved
        if resolved.backend != WHISPER_CPP:
            raise BadRequest(f"the {resolved.backend} backend does not transcribe; {WHISPER_CPP} does")
        if resolved.model.config.get("format") != "whisper":
            raise BadRequest(
                f"{asked.model} is a {resolved.model.config.get('format', 'unknown')} model, not a Whisper"
                " model: package one with `mrunner package --whisper FILE NAME`",
                code="model_not_whisper",
                param="model",
            )
        checked = asked.checked
        body, runner_type = checked.runner_form(translate)
        clock = self._gateway.clock
        async with self._gateway.lease(request, asked) as lease:
            began = clock.seconds()
            answer_type, said = await self._forwarder.forward(
                request,
                lease.socket,
                b"/inference",
                body,
                asked.meter,
                transform=_whole,
                content_type=runner_type,
            )
        if checked.audio.seconds:
            self._gateway.metrics.transcribed(asked.model, checked.audio.seconds, clock.seconds() - began)
        answer = transcript.reshaped(checked.response_format, checked.granularities, said)
        request.setHeader(b"content-type", answer_type)
        request.setHeader(b"content-length", b"%d" % len(answer))
        return answer


async def _whole(answer: Answer) -> tuple[bytes, bytes]:
    """whisper-server's answer, a few kilobytes of text (its content type and body), to reshape whole."""
    return answer.content_type, await answer.read()
