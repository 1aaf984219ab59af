"""OpenAI audio requests read and checked before a runner is asked for: the form, the file's format
and duration, each field's rules, and the form whisper-server is sent."""

from __future__ import annotations

import io
import json
import struct
import tracemalloc
import wave
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.openai import transcript, transcription
from mrunner.api.reading import audio, form
from mrunner.cli.transcribe import form as cli_form
from mrunner.errors import BadRequest


def wav(seconds: float, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(2 * int(rate * seconds)))
    return buffer.getvalue()


def chunk(name: bytes, payload: bytes) -> bytes:
    return name + struct.pack("<I", len(payload)) + payload + bytes(len(payload) & 1)


def riff(*chunks: bytes) -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def fmt(rate: int, byte_rate: int | None = None, channels: int = 1, bits: int = 16) -> bytes:
    """A PCM C{fmt } chunk; C{byte_rate} as the header claims it (what it should be by default)."""
    align = channels * bits // 8
    claimed = rate * align if byte_rate is None else byte_rate
    return chunk(b"fmt ", struct.pack("<HHIIHH", 1, channels, rate, claimed, align, bits))


def multipart(
    fields: list[tuple[str, str]], data: bytes | None, filename: str = "a.wav"
) -> tuple[bytes, bytes]:
    boundary = "XyZ"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n{v}\r\n' for n, v in fields]
    body = "".join(parts).encode()
    if data is not None:
        body += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                "Content-Type: audio/wav\r\n\r\n"
            ).encode()
            + data
            + b"\r\n"
        )
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}".encode()


def checked(fields: list[tuple[str, str]], data: bytes | None = None) -> transcription.Transcription:
    body, content_type = multipart([("model", "ai/whisper"), *fields], wav(2) if data is None else data)
    return transcription.check(transcription.payload(body, content_type))


class FormTests(SynchronousTestCase):
    def test_fields_and_a_file(self) -> None:
        body, content_type = multipart(
            [("model", "m"), ("timestamp_granularities[]", "word")], b"\x00\r\n--X"
        )
        found = form.fields(body, content_type)
        self.assertEqual(found["model"], [form.Part(b"m")])
        self.assertEqual(found["file"], [form.Part(b"\x00\r\n--X", "a.wav")])

    def test_refusals(self) -> None:
        body, content_type = multipart([("model", "m")], b"x")
        for bad_body, bad_type in [
            (body, b"application/json"),
            (body, None),
            (body[:-10], content_type),
            (b"--XyZ\r\nno headers\r\n--XyZ--\r\n", content_type),
        ]:
            self.assertRaises(BadRequest, form.fields, bad_body, bad_type)

    def test_thousands_of_tiny_parts_are_refused_at_the_limit(self) -> None:
        """Issue 53 L2: 2-byte parts between 1-character boundaries, split whole, cost 340 MB of RSS
        for a 25 MiB body; the walk stops at the 33rd part, holding a few of them."""
        part = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n\r\n'
        tiny = b"--b\r\n\r\n\r\n" * (4 * 2**20 // 9) + b"--b--\r\n"
        for body in (part * (form.MAX_FIELDS + 1) + b"--b--\r\n", tiny):
            tracemalloc.start()
            try:
                self.assertRaises(BadRequest, form.fields, body, b"multipart/form-data; boundary=b")
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            self.assertLess(peak, 2**20)
        self.assertEqual(
            len(form.fields(part * form.MAX_FIELDS + b"--b--", b"multipart/form-data; boundary=b")["x"]), 32
        )

    def test_the_cli_form_reads_back(self) -> None:
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(b"RIFF")
        body, content_type = cli_form({"model": "m", "response_format": "srt"}, Path(path))
        found = form.fields(body, content_type.encode())
        self.assertEqual(found["response_format"][0].value, b"srt")
        self.assertEqual(found["file"][0].value, b"RIFF")


class AudioTests(SynchronousTestCase):
    def test_wav_duration(self) -> None:
        heard = audio.read(wav(2.5), "a.wav")
        self.assertEqual(heard.format, "wav")
        self.assertAlmostEqual(heard.seconds or 0, 2.5)

    def test_other_formats_by_their_magic(self) -> None:
        flac = b"fLaC" + bytes(14) + ((16000 << 44) | 32000).to_bytes(8, "big")
        self.assertEqual(audio.read(flac, None), audio.Audio("flac", 2.0))
        mp3 = bytes([0xFF, 0xFB, 0x90, 0x00]) + bytes(16000 - 4)  # 128 kbit/s
        self.assertEqual(audio.read(mp3, None), audio.Audio("mp3", 1.0))
        vorbis = b"OggS" + bytes(24) + b"\x01vorbis" + bytes(5) + struct.pack("<I", 8000)  # version, channels
        last = b"OggS" + bytes(2) + struct.pack("<q", 16000) + bytes(8)
        self.assertEqual(audio.read(vorbis + last, None), audio.Audio("ogg", 2.0))

    def test_not_audio_is_named(self) -> None:
        for data, named in [
            (b"", "empty"),
            (b"GGUF\x03", "GGUF"),
            (b"%PDF-1.4", "PDF"),
            (b"abc", "not audio"),
        ]:
            with self.assertRaises(BadRequest) as refused:
                audio.read(data, "x.bin")
            self.assertIn(named, refused.exception.message)
            self.assertEqual(refused.exception.param, "file")


class LyingHeaderTests(SynchronousTestCase):
    """Issue 53 M2, M3, L1: the length is what the decoder will read, and a damaged header is a 400."""

    def refused(self, data: bytes, *words: str) -> None:
        with self.assertRaises(BadRequest) as raised:
            audio.read(data, "a.wav")
        self.assertEqual((raised.exception.param, raised.exception.code), ("file", "invalid_file"))
        for word in words:
            self.assertIn(word, raised.exception.message)

    def test_a_wav_is_measured_by_its_data_not_its_byte_rate(self) -> None:
        samples = bytes(2 * 2000 * 35 * 60)  # 35 minutes at 2 kHz
        for claimed in (10_000_000, 0, 1):
            heard = audio.read(riff(fmt(2000, claimed), chunk(b"data", samples)), None)
            self.assertAlmostEqual(heard.seconds or 0, 35 * 60)
            self.assertRaises(BadRequest, checked, [], riff(fmt(2000, claimed), chunk(b"data", samples)))

    def test_a_wav_data_size_past_the_end_counts_what_is_there(self) -> None:
        head = riff(fmt(8000))
        data = head + b"data" + struct.pack("<I", 0xFFFFFFFF) + bytes(16000)
        self.assertAlmostEqual(audio.read(data, None).seconds or 0, 1.0)

    def test_stereo_and_8_bit_frames(self) -> None:
        stereo = riff(fmt(8000, channels=2), chunk(b"data", bytes(32000)))
        self.assertAlmostEqual(audio.read(stereo, None).seconds or 0, 1.0)
        narrow = riff(fmt(8000, bits=8), chunk(b"data", bytes(8000)))
        self.assertAlmostEqual(audio.read(narrow, None).seconds or 0, 1.0)

    def test_damaged_wav_headers_are_400s(self) -> None:
        whole = riff(fmt(16000), chunk(b"data", bytes(320)))
        self.refused(riff(chunk(b"data", bytes(320)), fmt(16000)), "data chunk before its fmt chunk")
        self.refused(whole[: 12 + 8 + 6], "cut short inside its fmt chunk")
        self.refused(riff(fmt(0), chunk(b"data", bytes(320))), "sample rate of 0")
        self.refused(riff(fmt(16000, channels=0), chunk(b"data", bytes(320))), "channel count of 0")
        self.refused(riff(fmt(16000)), "no data chunk")
        self.refused(whole[:12], "no fmt chunk")

    def test_one_byte_is_a_400(self) -> None:
        for data in (b"\xff", b"I", b"R", b"RIFF\x04\x00\x00\x00WAVEfmt "):
            with self.assertRaises(BadRequest) as raised:
                audio.read(data, None)
            self.assertEqual(raised.exception.param, "file")

    def test_the_chunk_walk_is_bounded(self) -> None:
        """25 MiB of 8-byte JUNK chunks took the reactor 0.6 s a request: past 64, a 400 at once."""
        junk = chunk(b"JUNK", bytes(0))
        self.refused(riff(junk * (25 * 2**20 // 8), fmt(16000), chunk(b"data", b"")), "over 64 chunks")
        self.refused(riff(junk * (audio.MAX_WAV_CHUNKS - 1), fmt(16000), chunk(b"data", b"")), "over 64")
        many = riff(junk * (audio.MAX_WAV_CHUNKS - 2), fmt(16000), chunk(b"data", bytes(32000)))
        self.assertAlmostEqual(audio.read(many, None).seconds or 0, 1.0)

    def test_a_flac_without_its_length_is_a_400(self) -> None:
        def flac(rate: int, samples: int) -> bytes:
            return b"fLaC" + bytes(14) + ((rate << 44) | samples).to_bytes(8, "big")

        self.refused(flac(16000, 0), "does not say how many samples")
        self.refused(flac(0, 16000), "sample rate of 0")
        self.refused(flac(16000, 16000)[:20], "cut short")
        self.refused(b"fLaC\x04" + flac(16000, 16000)[5:], "STREAMINFO")
        self.assertRaises(BadRequest, checked, [], flac(1000, 35 * 60 * 1000))


class CheckTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        asked = checked([])
        self.assertEqual((asked.response_format, asked.language, asked.temperature), ("json", None, None))

    def test_fields(self) -> None:
        asked = checked(
            [
                ("response_format", "verbose_json"),
                ("language", "de"),
                ("prompt", "Names: Ada."),
                ("temperature", "0.2"),
                ("timestamp_granularities[]", "word"),
                ("timestamp_granularities[]", "segment"),
            ]
        )
        self.assertEqual(asked.granularities, ("word", "segment"))
        self.assertEqual((asked.language, asked.temperature), ("de", 0.2))

    def test_each_refusal(self) -> None:
        for fields, data in [
            ([("response_format", "docx")], None),
            ([("temperature", "2")], None),
            ([("temperature", "warm")], None),
            ([("language", "English")], None),
            ([("timestamp_granularities[]", "word")], None),  # needs verbose_json
            ([("response_format", "verbose_json"), ("timestamp_granularities[]", "line")], None),
            ([("prompt", "x" * 5000)], None),
            ([("stream", "true")], None),
            ([("model", "again")], None),
            ([], b""),
            ([], wav(transcription.MAX_AUDIO_SECONDS + 1, rate=100)),
        ]:
            self.assertRaises(BadRequest, checked, fields, data)

    def test_no_file(self) -> None:
        body, content_type = multipart([("model", "m")], None)
        self.assertRaises(BadRequest, transcription.payload, body, content_type)

    def test_the_runner_form(self) -> None:
        asked = checked([("response_format", "srt"), ("language", "en")])
        body, content_type = asked.runner_form(translate=True)
        found = form.fields(body, content_type)
        sent = {name: parts[0].value for name, parts in found.items()}
        self.assertEqual(sent["translate"], b"true")
        self.assertEqual(sent["response_format"], b"srt")
        self.assertEqual(sent["file"], asked.file)
        self.assertNotIn("translate", form.fields(*asked.runner_form(translate=False)))

    def test_the_record_keeps_no_audio(self) -> None:
        body, content_type = multipart([("model", "m")], wav(1))
        kept = transcription.recorded(transcription.payload(body, content_type))
        self.assertNotIn(b"RIFF", kept)
        self.assertIn(b'"bytes": 32044', kept)


#: whisper-server's verbose JSON for two segments (tokens as its "words", text on lines), trimmed.
VERBOSE = {
    "task": "transcribe",
    "language": "english",
    "duration": 2.5,
    "text": " Hello world.\n It's here\n",
    "segments": [
        {
            "id": 0,
            "text": " Hello world.",
            "start": 0.0,
            "end": 1.2,
            "tokens": [1, 2, 3, 4],
            "words": [
                {"word": " Hello", "start": 0.0, "end": 0.4, "t_dtw": -1, "probability": 0.9},
                {"word": " wor", "start": 0.5, "end": 0.7, "t_dtw": -1, "probability": 0.9},
                {"word": "ld", "start": 0.7, "end": 1.0, "t_dtw": -1, "probability": 0.9},
                {"word": ".", "start": 1.0, "end": 1.2, "t_dtw": -1, "probability": 0.9},
            ],
        },
        {
            "id": 1,
            "text": " It's here",
            "start": 1.2,
            "end": 2.5,
            "tokens": [5, 6, 7],
            "words": [
                {"word": " It", "start": 1.3, "end": 1.5},
                {"word": "'s", "start": 1.5, "end": 1.6},
                {"word": " here", "start": 1.7, "end": 2.4},
            ],
        },
    ],
}


class AnswerShapeTests(SynchronousTestCase):
    """whisper-server's answers in OpenAI's shape (issue 53 N5, N6)."""

    def reshaped(self, response_format: str, granularities: tuple[str, ...] = ()) -> dict:
        return json.loads(transcript.reshaped(response_format, granularities, json.dumps(VERBOSE).encode()))

    def test_text_has_no_leading_space_or_trailing_newline(self) -> None:
        self.assertEqual(transcript.reshaped("text", (), b" w22239\n"), b"w22239")
        self.assertEqual(
            transcript.reshaped("text", (), b" Hello world.\n It's here\n"), b"Hello world. It's here"
        )
        self.assertEqual(transcript.reshaped("json", (), b'{"text":" w22239\\n"}'), b'{"text":"w22239"}')

    def test_words_are_top_level_as_openai_gives_them(self) -> None:
        answer = self.reshaped("verbose_json", ("word", "segment"))
        self.assertEqual(
            answer["words"],
            [
                {"word": "Hello", "start": 0.0, "end": 0.4},
                {"word": "world", "start": 0.5, "end": 1.0},
                {"word": "It's", "start": 1.3, "end": 1.6},
                {"word": "here", "start": 1.7, "end": 2.4},
            ],
        )
        self.assertEqual(answer["text"], "Hello world. It's here")
        self.assertEqual([segment["text"] for segment in answer["segments"]], [" Hello world.", " It's here"])
        self.assertNotIn("words", answer["segments"][0])

    def test_no_words_unless_asked(self) -> None:
        answer = self.reshaped("verbose_json", ("segment",))
        self.assertNotIn("words", answer)
        self.assertEqual(answer["segments"][1]["tokens"], [5, 6, 7])

    def test_subtitles_pass_as_they_are(self) -> None:
        srt = b"1\n00:00:00,540 --> 00:00:07,340\n w22249\n\n"
        self.assertEqual(transcript.reshaped("srt", (), srt), srt)
